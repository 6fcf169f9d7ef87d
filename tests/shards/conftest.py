"""The sample KB built as one bundle of 2 shards (same encoder, same settings as the sample bundle)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sharded_bundle_path(tmp_path_factory, encoder, sample_kb, sample_bundle_path) -> Path:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    out = tmp_path_factory.mktemp("sharded") / "sample2"
    build_bundle(sample_kb, out, BuildConfig(shards=2), encoder, progress=False)
    return out
