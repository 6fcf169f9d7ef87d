"""A sharded bundle served through Ray: shard actors answer as the one index, the Serve deployment is
the same HTTP API, and a shard actor killed under load costs 503s with Retry-After, never a wrong answer.

One module-scoped local Ray cluster (4 logical CPUs: two shard actors, one Serve replica, the proxy)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest
from tests.shards.test_sharded import QUERIES, assert_same

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", params=[True, False], ids=["local_reads", "through_the_actors"])
def ray_sharded(request, ray_cluster, sharded_bundle_path, encoder):
    """The shards as Ray actors, their memory rows read by this process from the shards' files (it
    runs on their machine) or sent by the actors."""
    from softknn.storage.ray_shards import RayShards

    b = load_bundle(sharded_bundle_path, expected_fingerprint=encoder.info.fingerprint,
                    shard_backend=RayShards.factory(num_cpus=1, local_reads=request.param))
    yield b
    b.close()


def test_memory_rows_are_read_here_only_with_local_reads(ray_sharded, sharded_bundle_path, encoder):
    """With local reads no request asks a shard for memory rows, and the rows read here are the
    bytes the shard actors send."""
    from softknn.storage.ray_shards import RayShards

    calls: list[str] = []
    be = ray_sharded.backend
    some = be.call_some

    def logged(method, shards, args):
        calls.append(method)
        return some(method, shards, args)

    be.call_some = logged
    try:
        Engine(encoder, ray_sharded).infer(QUERIES, InferParams(retrieval="hybrid"))
    finally:
        be.call_some = some
    local = be.local_reads
    assert [m for m in calls if m.endswith("_rows")] == ([] if local else ["hidden_rows"])
    assert calls[0] == "lexical_candidates"
    if local:
        other = load_bundle(sharded_bundle_path, expected_fingerprint=encoder.info.fingerprint,
                            shard_backend=RayShards.factory(num_cpus=0.5, local_reads=False))
        try:
            rows = np.arange(0, ray_sharded.kv.hidden.shape[0], 7)
            assert np.array_equal(ray_sharded.kv.hidden[rows], other.kv.hidden[rows])
        finally:
            other.close()


@pytest.mark.parametrize("retrieval", ["hybrid", "dense", "lexical"])
@pytest.mark.parametrize("exact", [False, True])
def test_ray_answers_equal_one_index(retrieval, exact, ray_sharded, sample_bundle, encoder):
    p = InferParams(retrieval=retrieval, exact=exact)
    assert_same(Engine(encoder, sample_bundle).infer(QUERIES, p), Engine(encoder, ray_sharded).infer(QUERIES, p))


def test_ray_filtered_answers_equal_one_index(ray_sharded, sample_bundle, encoder, monkeypatch):
    from softknn.retrieval import search
    from softknn.retrieval.filters import parse_filter
    from tests.shards.test_sharded import FILTER

    monkeypatch.setattr(search, "FILTER_SCAN_MAX", 0)  # the shard actors' search_among, not rows_dot alone
    p = InferParams(filter=parse_filter(FILTER))
    assert_same(Engine(encoder, sample_bundle).infer(QUERIES, p), Engine(encoder, ray_sharded).infer(QUERIES, p))


def _settings(bundle, port=8000):
    from softknn.params import Settings

    return Settings(bundle=bundle, port=port, model={"threads": 1}, limits={"max_k": 512})


REQUEST = {"inputs": [QUERIES[0]], "exact": True, "k": 8}


def test_shard_killed_under_load(ray_cluster, sharded_bundle_path, sample_bundle, encoder):
    """Kill shard 1's actor while 3 clients send requests: every answer is the one-index answer or a
    503 shard_unavailable with Retry-After; every request is answered; the service recovers."""
    from softknn.service.app import create_app
    from softknn.storage.ray_shards import RayShards

    want = Engine(encoder, sample_bundle).infer(REQUEST["inputs"], InferParams(exact=True, k=8))[0].to_dict()
    app = create_app(_settings(sharded_bundle_path), encoder=encoder,
                     shard_backend=RayShards.factory(num_cpus=1, timeout_s=60))
    outcomes: list[tuple[float, int, dict, dict]] = []
    lock = threading.Lock()
    stop = threading.Event()
    killed_at: list[float] = []
    recovered = threading.Event()
    sent = [0]

    with TestClient(app) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
            time.sleep(0.5)
        assert client.get("/readyz").status_code == 200

        def worker():
            while not stop.is_set():
                with lock:
                    sent[0] += 1
                r = client.post("/v1/infer", json=REQUEST)
                t = time.monotonic()
                with lock:
                    outcomes.append((t, r.status_code, dict(r.headers), r.json()))
                if r.status_code == 200 and killed_at and t > killed_at[0]:
                    recovered.set()

        with ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(worker) for _ in range(3)]
            while len(outcomes) < 3:  # load is flowing
                time.sleep(0.05)
            handle = app.state.runtime.engine.bundle.backend.handles[1]
            killed_at.append(time.monotonic())
            ray.kill(handle, no_restart=False)  # Ray restarts it (max_restarts=-1)
            assert recovered.wait(300), "no correct answer after the kill"
            stop.set()
            for f in futs:
                f.result()
        assert client.get("/readyz").status_code == 200
        final = client.post("/v1/infer", json=REQUEST)
    assert final.status_code == 200
    assert len(outcomes) == sent[0]  # none lost
    statuses = {s for _, s, _, _ in outcomes}
    assert statuses <= {200, 503}, statuses
    for _, status, headers, body in outcomes + [(0, 200, {}, final.json())]:
        if status == 503:
            assert body["error"]["type"] == "shard_unavailable", body
            assert headers.get("retry-after") == "1"
        else:
            got = body["results"][0]
            assert np.abs(np.asarray(got["embedding"]) - np.asarray(want["embedding"])).max() <= 1e-6
            assert [e["chunk_id"] for e in got["evidence"]] == [e["chunk_id"] for e in want["evidence"]]
    print(f"shard kill: {len(outcomes)} responses, {sum(s == 503 for _, s, _, _ in outcomes)} × 503")


def test_serve_deployment_same_api(ray_cluster, sharded_bundle_path, sample_bundle, encoder):
    """`softknn serve --ray`'s Serve application: same /openapi.json, same exact answer, same error shape."""
    from ray import serve

    from softknn.service.app import create_app
    from softknn.service.ray.launcher import kill_named_shards, serve_ray
    from tests.harness import free_port

    port = free_port()
    settings = _settings(sharded_bundle_path, port)
    serve_ray(settings, replicas=1, replica_cpus=1, shard_cpus=0.5, blocking=False)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            end = time.monotonic() + 600
            while time.monotonic() < end:
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(1)
            assert c.get("/readyz").status_code == 200
            assert c.get("/openapi.json").json() == create_app(settings, encoder=encoder).openapi()
            want = Engine(encoder, sample_bundle).infer(REQUEST["inputs"], InferParams(exact=True, k=8))[0].to_dict()
            got = c.post("/v1/infer", json=REQUEST).json()["results"][0]
            assert np.abs(np.asarray(got["embedding"]) - np.asarray(want["embedding"])).max() <= 1e-6
            assert [e["chunk_id"] for e in got["evidence"]] == [e["chunk_id"] for e in want["evidence"]]
            bad = c.post("/v1/infer", json={"inputs": ["x"], "k": 0})
            assert bad.status_code == 422 and set(bad.json()["error"]) == {"type", "message", "field"}
            index = c.get("/v1/index").json()["index"]
            assert index["counts"] == sample_bundle.manifest.raw["counts"]
            assert index["version_id"] == read_manifest(sharded_bundle_path)["version_id"]
    finally:
        serve.shutdown()
        assert kill_named_shards() == 2


def test_reload_swaps_every_shard_or_none(ray_cluster, sharded_bundle_path, tmp_path, encoder):
    """A reload to a sharded bundle with a corrupt shard file is refused (422) and the old shard actors
    keep serving; a good one replaces every shard actor at once."""
    import shutil

    from softknn.params import Settings
    from softknn.service.app import create_app
    from softknn.storage.ray_shards import RayShards

    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(sharded_bundle_path, good)
    shutil.copytree(sharded_bundle_path, bad)
    (bad / "shard-0001" / "embeddings.npy").write_bytes(b"\x93NUMPY corrupt")
    settings = Settings(bundle=sharded_bundle_path, model={"threads": 1}, auth={"admin_token": "adm"})
    app = create_app(settings, encoder=encoder, shard_backend=RayShards.factory(num_cpus=0.5))
    admin = {"Authorization": "Bearer adm"}
    with TestClient(app) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
            time.sleep(0.5)
        before = app.state.runtime.engine.bundle.backend.handles
        r = client.post("/v1/admin/reload", json={"bundle": str(bad)}, headers=admin)
        assert r.status_code == 422 and "shard-0001/embeddings.npy" in r.json()["error"]["message"]
        assert app.state.runtime.engine.bundle.backend.handles is before
        assert client.post("/v1/infer", json=REQUEST).status_code == 200
        r = client.post("/v1/admin/reload", json={"bundle": str(good)}, headers=admin)
        assert r.status_code == 200, r.text
        after = app.state.runtime.engine.bundle.backend.handles
        assert len(after) == 2 and not {h._actor_id for h in after} & {h._actor_id for h in before}
        assert app.state.runtime.engine.bundle.path == good
        assert client.post("/v1/infer", json=REQUEST).status_code == 200
