"""Every memory representation shards: a bundle of 2 shards of `kv`, `hidden` (the default, also
the whole of tests/shards/test_sharded.py), `hidden-fp16`, `hidden-int8` or `recompute` holds the one-index bundle's memory rows, split by token range (int8:
the whole KB's scale in every shard), and answers as the one-index bundle of the same memory does,
in this process, over HTTP and (slow) through Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.params import Settings
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest
from softknn.storage.memory_stores import MEMORY_FILES
from softknn.storage.shards import ShardedBundle
from tests.harness import wait_ready
from tests.numerics import assert_tree_close
from tests.shards.test_sharded import QUERIES, assert_same

# hidden (the default: test_sharded.py's bundle) and hidden-fp16 take hidden-int8's path without the
# scale: slow (two builds each); kv (no longer the default bundle's) and the others by default
KINDS = ["kv", pytest.param("hidden", marks=pytest.mark.slow), pytest.param("hidden-fp16", marks=pytest.mark.slow),
         "hidden-int8", "recompute"]
KB = [
    ("sm-01", "Dogs must stay on a lead on the car deck and in the outdoor seating areas.", "pets"),
    ("sm-02", "Cats travel in a closed carrier; the carrier stays with you in the lounge at all times.", "pets"),
    ("sm-03", "A refund is paid within five working days to the card used for the booking.", "refunds"),
    ("sm-04", "Cancel up to two hours before departure for a full refund of a flexible fare.", "refunds"),
    ("sm-05", "Sailings are cancelled when the wind is forecast above force eight.", "weather"),
    ("sm-06", "In fog the crossing is slower and departures may be held until it lifts.", "weather"),
    ("sm-07", "The cafe serves hot food until thirty minutes before arrival.", "food"),
    ("sm-08", "Vegetarian and gluten-free meals are always on the menu.", "food"),
]
CPU = torch.device("cpu")
IDS, WEIGHTS = [[0, 5, 2], [7], [3, 1, 6, 4], []], [[0.5, 0.3, 0.2], [1.0], [0.4, 0.3, 0.2, 0.1], []]
BODY = {"inputs": ["can my dog come on the deck?", "when do I get my money back", "is the ferry running in a storm"],
        "exact": True, "k": 4}


@pytest.fixture(scope="module")
def built(tmp_path_factory, encoder):
    """built(kind): (one-index bundle, 2-shard bundle) of KB, built once per kind; batch_size 3, so
    the int8 scale is the max over several encoded batches, not set by shard 1's rows alone."""
    root = tmp_path_factory.mktemp("sharded_memory")
    kb = root / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in KB))
    out: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in out:
            one, two = root / f"{kind}-1", root / f"{kind}-2"
            build_bundle(kb, one, BuildConfig(memory=kind, batch_size=3), encoder, progress=False)
            build_bundle(kb, two, BuildConfig(memory=kind, batch_size=3, shards=2), encoder, progress=False)
            out[kind] = (one, two)
        return out[kind]

    return get


@pytest.mark.parametrize("kind", KINDS)
def test_each_shard_holds_its_rows_of_the_memory(built, kind):
    one, two = built(kind)
    m = read_manifest(two)
    assert m["memory"] == kind and [s["dir"] for s in m["shards"]] == ["shard-0000", "shard-0001"]
    for name in MEMORY_FILES[kind]:
        whole = np.load(one / name)
        parts = [np.load(two / s["dir"] / name) for s in m["shards"]]
        if name == "mem_hidden_scale.npy":  # the whole KB's scale, copied: not a per-shard max
            assert all(np.array_equal(p, whole) for p in parts)
            assert not np.array_equal(np.abs(np.load(two / "shard-0001" / "mem_hidden.npy")).max(0), np.full(384, 127))
        else:
            assert whole.dtype == parts[0].dtype and np.array_equal(whole, np.concatenate(parts)), name
    other = "mem_hidden.npy" if kind == "kv" else "kv_keys.npy"  # only the kind's own files
    assert not any((two / s["dir"] / other).exists() for s in m["shards"])


@pytest.mark.parametrize("kind", KINDS)
def test_gather_equals_the_one_index_store(built, encoder, kind):
    one, two = (load_bundle(p) for p in built(kind))
    assert isinstance(two, ShardedBundle)
    a, b = Engine(encoder, one).memory, Engine(encoder, two).memory  # attached to the model
    x, y = a.gather(IDS, WEIGHTS, CPU), b.gather(IDS, WEIGHTS, CPU)
    for f in ("key", "value", "token_mask", "weight"):
        assert torch.equal(getattr(x, f), getattr(y, f)), f  # same rows, same dequantisation, one GEMM


@pytest.mark.parametrize("kind", KINDS)
def test_answers_equal_the_one_index_bundle(built, encoder, kind):
    one, two = (Engine(encoder, load_bundle(p)) for p in built(kind))
    q = [*BODY["inputs"], "zzz qqq"]
    for retrieval in ("hybrid", "dense"):
        exact = InferParams(retrieval=retrieval, exact=True, k=4)
        assert [r.to_dict() for r in one.infer(q, exact)] == [r.to_dict() for r in two.infer(q, exact)]
        assert_same(two.infer(q, InferParams(retrieval=retrieval, k=4)), one.infer(q, InferParams(retrieval=retrieval, k=4)))


def _http(bundle: Path, encoder, body: dict, shard_backend=None) -> tuple[list[dict], dict]:
    from softknn.service.app import create_app

    app = create_app(Settings(bundle=bundle, model={"threads": 1}), encoder=encoder, shard_backend=shard_backend)
    with TestClient(app) as client:
        wait_ready(client, 120)
        r = client.post("/v1/infer", json=body)
        assert r.status_code == 200, r.text
        return r.json()["results"], client.get("/v1/index").json()["index"]


def test_sharded_hidden_int8_over_http_equals_unsharded(built, encoder):
    (one, two) = built("hidden-int8")
    want, _ = _http(one, encoder, BODY)
    got, index = _http(two, encoder, BODY)
    assert index["memory"]["kind"] == "hidden-int8"
    assert [[e["chunk_id"] for e in r["evidence"]] for r in got] == [[e["chunk_id"] for e in r["evidence"]] for r in want]
    assert_tree_close(got, want, 1e-6)


# --- the sample KB through the CLI, served in-process and through Ray (slow: four builds) --------------
@pytest.fixture(scope="module")
def sample_int8(tmp_path_factory, sample_kb) -> tuple[Path, Path]:
    from softknn.cli import app

    root = tmp_path_factory.mktemp("sample_int8")
    for out, extra in ((root / "one", []), (root / "two", ["--shards", "2"])):
        r = CliRunner().invoke(app, ["build", str(sample_kb), "--out", str(out), "--memory", "hidden-int8", *extra])
        assert r.exit_code == 0, r.output
    return root / "one", root / "two"


SAMPLE_BODY = {"inputs": QUERIES, "exact": True, "k": 8}


@pytest.mark.slow
def test_cli_sharded_hidden_int8_serves_the_unsharded_answers(sample_int8, encoder):
    one, two = sample_int8
    assert read_manifest(two)["memory"] == "hidden-int8" and len(read_manifest(two)["shards"]) == 2
    for retrieval in ("hybrid", "dense"):
        body = dict(SAMPLE_BODY, retrieval=retrieval)
        want, _ = _http(one, encoder, body)
        got, _ = _http(two, encoder, body)
        assert [[e["chunk_id"] for e in r["evidence"]] for r in got] == [[e["chunk_id"] for e in r["evidence"]] for r in want]
        assert_tree_close(got, want, 1e-6)


@pytest.mark.slow
def test_ray_sharded_hidden_int8_serves_the_unsharded_answers(sample_int8, encoder):
    ray = pytest.importorskip("ray")
    from softknn.storage.ray_shards import RayShards

    one, two = sample_int8
    want, _ = _http(one, encoder, SAMPLE_BODY)
    ray.init(address="local", num_cpus=3, include_dashboard=False, namespace="softknn", log_to_driver=False)
    try:
        got, index = _http(two, encoder, SAMPLE_BODY, shard_backend=RayShards.factory(num_cpus=1, timeout_s=60))
    finally:
        ray.shutdown()
    assert index["memory"]["kind"] == "hidden-int8"
    assert [[e["chunk_id"] for e in r["evidence"]] for r in got] == [[e["chunk_id"] for e in r["evidence"]] for r in want]
    assert_tree_close(got, want, 1e-6)


class _ShardsElsewhere:
    """In-process shards behind the interface a remote backend has (RayShards: `local_reads`), each
    call logged: what a replica on the shards' machine sees, without Ray."""

    def __init__(self, specs, local_reads: bool):
        from softknn.storage.shards import LocalShards, Shard

        self.inner = LocalShards([Shard(d, lo, v) for d, lo, v in specs])
        self.local_reads, self.calls = local_reads, []

    def call(self, method, args):
        self.calls.append(method)
        return self.inner.call(method, args)

    def call_some(self, method, shards, args):
        self.calls.append(method)
        return self.inner.call_some(method, shards, args)

    def health(self):
        return []

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("kind", KINDS)
def test_local_reads_gather_the_bytes_the_shards_send(built, encoder, kind):
    """With local reads every stored representation gathers bit for bit what the shards send (and
    what the one-index store gathers), and asks no shard for memory rows; without, it asks them."""
    one, two = built(kind)
    made: dict[bool, _ShardsElsewhere] = {}

    def factory(local_reads):
        def make(specs, version=""):
            made[local_reads] = _ShardsElsewhere(specs, local_reads)
            return made[local_reads]
        return make

    want = Engine(encoder, load_bundle(one)).memory.gather(IDS, WEIGHTS, CPU)
    for local_reads in (True, False):
        b = load_bundle(two, shard_backend=factory(local_reads))
        got = Engine(encoder, b).memory.gather(IDS, WEIGHTS, CPU)
        for f in ("key", "value", "token_mask", "weight"):
            assert torch.equal(getattr(want, f), getattr(got, f)), (local_reads, f)
        asked = [m for m in made[local_reads].calls if m.endswith("_rows")]
        reads_rows = kind != "recompute"  # recompute encodes the chunk texts this process holds
        assert asked == ([] if local_reads or not reads_rows else [{"kv": "kv_rows"}.get(kind, "hidden_rows")]), asked
        assert ("memory_maps" in made[local_reads].calls) == local_reads
        b.close()
