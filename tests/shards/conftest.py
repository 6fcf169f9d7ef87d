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


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 4 logical CPUs for one test module (the Ray tests' own, shut down after it)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="softknn", log_to_driver=False)
    yield
    ray.shutdown()
