"""`softknn build --ray`: the encode step on Ray Data gives the local build's bundle, byte for byte.

Ray clusters here are this test's own: a local one (`address="local"` inside RayEncode, never a
cluster another program runs on this machine) and, in the slow suite, a two-node cluster on one
machine (tests/ray_nodes.py: `ray start --head` + `ray start --address` on free ports, token auth
with a token of its own), stopped by process group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from softknn.index_builder import pipeline
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.storage.layout import sha256_file, verify_bundle
from tests.harness import free_port
from tests.ray_nodes import ray_env, start_node, stop_node, wait_for_cpus

ROOT = Path(__file__).resolve().parents[2]


def _files(bundle: Path) -> dict[str, str]:
    """Every file's sha256, computed from the bytes on disk (not read from the manifest)."""
    return {str(p.relative_to(bundle)): sha256_file(p) for p in sorted(bundle.rglob("*")) if p.is_file()
            and p.name != "manifest.json"}


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _three_then_crash(done: list[int]):
    """An encode strategy that encodes the first 3 batches it is given (appending their numbers to
    `done`), then fails as a killed build would."""
    def encode(enc, chunks, batches, layer, cfg):
        for s, rows in batches[:3]:
            yield s, pipeline.encode_batch(enc, [chunks[r].text for r in rows], [chunks[r].start for r in rows],
                                           layer, cfg)
            done.append(s)
        raise OSError(5, "simulated crash")
    return encode


def _same_bundle(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    assert len(fa) >= 7 and fa == fb
    ma, mb = _manifest(a), _manifest(b)
    assert ma["version_id"] == mb["version_id"]
    assert {k: v for k, v in ma.items() if k != "created_at"} == {k: v for k, v in mb.items() if k != "created_at"}
    verify_bundle(b)


def test_cli_refuses_ray_options_without_ray(tmp_path, sample_kb):
    r = subprocess.run([sys.executable, "-m", "softknn", "build", str(sample_kb), "--out", str(tmp_path / "b"),
                        "--address", "127.0.0.1:1"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --address and --ray-workers need --ray"
    assert not (tmp_path / "b").exists()


def test_ray_encode_refuses_bad_sizes():
    from softknn.index_builder.distributed import RayEncode

    with pytest.raises(ValueError, match="workers must be at least 1"):
        RayEncode(workers=0)
    with pytest.raises(ValueError, match="cpus_per_worker must be at least 1"):
        RayEncode(cpus_per_worker=0)


def test_a_worker_refuses_other_model_weights(encoder):
    from softknn.common.errors import BundleError
    from softknn.index_builder.distributed import _EncodeWorker

    with pytest.raises(BundleError, match=r"this worker's model weights differ from the driver's \(fingerprint "
                                          + encoder.info.fingerprint[:16] + " ≠ 0000000000000000\); every node"):
        _EncodeWorker(None, "0" * 64, 5, BuildConfig(), 1)


@pytest.mark.parametrize("memory, files", [("hidden", ["hidden.npy"]), ("kv", ["keys.npy", "values.npy"])])
def test_the_worker_transport_carries_encode_batchs_arrays_exactly(encoder, sample_kb, tmp_path, memory, files):
    """A worker's output row (one .npz per batch), read back by the driver, writes the same shard
    files as the local path, byte for byte; no Ray involved (the Ray runs are the slow tests)."""
    from softknn.index_builder.distributed import _arrays, _EncodeWorker

    chunks = pipeline.chunk_documents(pipeline.read_kb(sample_kb, BuildConfig().fields), encoder.tokenizer,
                                      encoder.max_seq_length - 8, 32)
    batches = pipeline._batches(chunks, encoder.tokenizer, 32)
    worker = _EncodeWorker.__new__(_EncodeWorker)  # the actor's state without Ray's runtime context
    cfg = BuildConfig(memory=memory)  # the default (hidden) and stored K/V
    worker.encoder, worker.layer, worker.cfg = encoder, 5, cfg
    picked = [0, len(batches) - 1]  # the shortest and the longest chunks
    payload = [json.dumps({"texts": [chunks[r].text for r in batches[s]], "starts": [chunks[r].start for r in batches[s]]},
                          ensure_ascii=False) for s in picked]
    out = worker({"batch": np.asarray(picked), "payload": np.asarray(payload, dtype=object)})
    assert out["batch"].tolist() == picked and set(out) == {"batch", "arrays"}
    for s, npz in zip(picked, out["arrays"], strict=True):
        pipeline.write_shard(tmp_path / f"ray-{s}", batches[s], _arrays(npz))
        pipeline._encode_shard(encoder, chunks, batches[s], 5, cfg, tmp_path / f"local-{s}")
        names = sorted(p.name for p in (tmp_path / f"local-{s}").iterdir())
        assert names == sorted(["counts.npy", "emb.npy", "rows.npy", "spans.npy", *files])
        assert sorted(p.name for p in (tmp_path / f"ray-{s}").iterdir()) == names
        for name in names:
            assert (tmp_path / f"ray-{s}" / name).read_bytes() == (tmp_path / f"local-{s}" / name).read_bytes(), name


@pytest.mark.slow
def test_a_ray_build_resuming_a_local_one_equals_the_local_build(tmp_path, sample_kb, sample_bundle_path, encoder):
    """A local build killed after 3 batches, finished by Ray Data on a 2-worker local cluster: every
    file and the version equal the plain local build of the same KB (the session's sample bundle)."""
    from softknn.index_builder.distributed import RayEncode

    out = tmp_path / "b"
    done: list[int] = []
    three_then_crash = _three_then_crash(done)

    with pytest.raises(Exception, match="simulated crash"):
        build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False, encode=three_then_crash)
    partial = tmp_path / ".b.partial"
    assert sorted(p.name for p in partial.glob("shard-*")) == [f"shard-{s:06d}" for s in done] and len(done) == 3

    seen = []

    class Recorder(RayEncode):
        def __call__(self, enc, chunks, batches, layer, cfg):
            seen.extend(s for s, _ in batches)
            yield from super().__call__(enc, chunks, batches, layer, cfg)

    ray_encode = Recorder(workers=2)
    build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False, encode=ray_encode)
    n_batches = len(pipeline._batches(pipeline.chunk_documents(pipeline.read_kb(sample_kb, BuildConfig().fields),
                                                               encoder.tokenizer, encoder.max_seq_length - 8, 32),
                                      encoder.tokenizer, 32))
    assert sorted(seen) == [s for s in range(n_batches) if s not in done]  # only the unfinished batches
    assert ray_encode.workers_used == 2 and len(ray_encode.nodes) == 1
    _same_bundle(sample_bundle_path, out)
    assert not partial.exists()
    import ray

    assert not ray.is_initialized()  # the cluster it started is stopped


@pytest.mark.slow
def test_a_cached_build_killed_part_way_and_finished_by_ray_equals_the_local_build(tmp_path, sample_kb,
                                                                                   sample_bundle_path, encoder):
    """Through an encode cache: the batches a killed build encoded stay in the cache, Ray Data encodes
    only the rest, and the bundle is the plain local build's, byte for byte (the sample KB has no
    repeated chunk text, so the cache's batches are the builder's own)."""
    from softknn.index_builder.distributed import RayEncode

    out, cache = tmp_path / "b", tmp_path / "cache"
    done: list[int] = []
    three_then_crash = _three_then_crash(done)

    with pytest.raises(Exception, match="simulated crash"):
        build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False, encode=three_then_crash, cache=cache)
    assert len(list(cache.glob("*/batch-*"))) == 3 and not out.exists()
    ray_encode = RayEncode(workers=2)
    stats: dict = {}
    build_bundle(sample_kb, out, BuildConfig(), encoder, progress=False, encode=ray_encode, cache=cache, stats=stats)
    assert stats["reused"] == 3 * 32 and stats["encoded"] == stats["chunks"] - 3 * 32
    assert ray_encode.workers_used == 2
    _same_bundle(sample_bundle_path, out)


# --- a two-node cluster on one machine ------------------------------------------------------------
@pytest.mark.slow
def test_softknn_build_ray_on_a_two_node_cluster_equals_the_local_build(tmp_path, sample_kb, sample_bundle_path):
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = ray_env()
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [start_node("--head", "--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard", "false", "--ray-client-server-port", str(free_port()),
                        temp_dir=temp_dir, env=env)]
    try:
        wait_for_cpus(address, 1, nodes, env)  # the head answers once its GCS is up
        nodes.append(start_node("--address", address, "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
                                temp_dir=temp_dir, env=env))
        wait_for_cpus(address, 2, nodes, env)

        out = tmp_path / "b"
        r = subprocess.run([sys.executable, "-m", "softknn", "build", str(sample_kb), "--out", str(out),
                            "--no-progress", "--ray", "--address", address, "--ray-workers", "2"],
                           cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        # one CPU per node and two one-CPU workers: a worker placed on each node (the line counts the
        # nodes the workers were placed on, whichever of them encoded the batches)
        assert "encoded with Ray Data: 2 workers on 2 node(s)" in r.stdout.splitlines(), r.stdout
        _same_bundle(sample_bundle_path, out)
    finally:
        for proc in reversed(nodes):
            stop_node(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)
