"""Session fixtures shared by every test package: the real model and the sample bundle, built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def encoder():
    from softknn.encoder import Encoder

    return Encoder()


@pytest.fixture(scope="session")
def sample_kb() -> Path:
    from softknn.cli import sample_kb_path

    return sample_kb_path()


@pytest.fixture(scope="session")
def sample_bundle_path(tmp_path_factory, encoder, sample_kb) -> Path:
    from index_builder.pipeline import BuildConfig, build_bundle

    out = tmp_path_factory.mktemp("bundles") / "sample"
    build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False)
    return out


@pytest.fixture(scope="session")
def sample_bundle(sample_bundle_path, encoder):
    from softknn.bundle import load_bundle

    return load_bundle(sample_bundle_path, expected_fingerprint=encoder.info.fingerprint)


@pytest.fixture(scope="session")
def engine(encoder, sample_bundle):
    from softknn.engine import Engine

    return Engine(encoder, sample_bundle)


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data; skips (saying so) where the shared folder is absent."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (../shared/data is absent on this machine)")
    return p
