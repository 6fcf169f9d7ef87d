"""Session fixtures shared by every test package: the real model and the sample bundle, built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def encoder():
    from softknn.model.encoder import Encoder

    return Encoder()


@pytest.fixture(scope="session")
def sample_kb() -> Path:
    from softknn.cli import sample_kb_path

    return sample_kb_path()


@pytest.fixture(scope="session")
def sample_bundle_path(tmp_path_factory, encoder, sample_kb) -> Path:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    out = tmp_path_factory.mktemp("bundles") / "sample"
    build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False)
    return out


@pytest.fixture(scope="session")
def sample_bundle(sample_bundle_path, encoder):
    from softknn.storage.bundle import load_bundle

    return load_bundle(sample_bundle_path, expected_fingerprint=encoder.info.fingerprint)


@pytest.fixture(scope="session")
def engine(encoder, sample_bundle):
    from softknn.infer.engine import Engine

    return Engine(encoder, sample_bundle)


@pytest.fixture(scope="session")
def generator():
    """The packaged generator (smollm2-135m-instruct), loaded once: its decode loop is built at its first
    generation and kept on it, so every app of the session that shares it pays that once."""
    from softknn.generate.model import Generator

    return Generator.load()


@pytest.fixture(scope="session")
def gen_bundle(tmp_path_factory, encoder, generator) -> Path:
    """A small generator bundle: the sample KB's first 30 records with the generator's memory (its k/β
    calibration skipped: the fixed defaults)."""
    from softknn.cli import sample_kb_path
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    root = tmp_path_factory.mktemp("gen_kb")
    kb = (sample_kb_path() / "kb.jsonl").read_text(encoding="utf-8")
    lines = [line for line in kb.splitlines() if line.strip()][:30]
    (root / "kb.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    build_bundle(root / "kb.jsonl", root / "bundle", BuildConfig(generator_calibrate=False), encoder, progress=False,
                 generator=generator)
    return root / "bundle"


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data; skips (saying so) where the shared folder is absent."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (../shared/data is absent on this machine)")
    return p


@pytest.fixture(scope="session")
def dense_only_bundle_path(tmp_path_factory, sample_bundle_path) -> Path:
    """The sample bundle as a build from before the lexical index existed: the same core files and a
    manifest without `lexical` (what `BuildConfig(lexical=False)` writes, without a second encode)."""
    import json
    import shutil

    from softknn.storage.bundle import finalize
    from softknn.storage.layout import DATA_FILES, read_manifest

    tmp = tmp_path_factory.mktemp("dense_only") / ".tmp"
    tmp.mkdir()
    for name in DATA_FILES:
        shutil.copy2(sample_bundle_path / name, tmp / name)
    old = {k: v for k, v in read_manifest(sample_bundle_path).items()
           if k not in ("lexical", "files", "version_id", "created_at")}
    out = tmp.parent / "sample_dense_only"
    finalize(tmp, out, json.loads(json.dumps(old)))
    return out
