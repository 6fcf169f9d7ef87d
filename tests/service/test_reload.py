"""POST /v1/admin/reload: atomic swap under load; corrupt and foreign bundles refused, old one serving.

Nothing here waits a fixed time for something to happen (CI runs on a loaded 2-core
box): the tests wait for the event itself (an answer sent after a swap, a request queued) with a
generous deadline, and a queued request is held in the queue by the batcher's own rule (a micro-batch
is taken when full), not by a timer that a slow reload could outlast.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from softknn.storage.bundle import load_bundle

DEADLINE_S = 60.0  # for an event that takes well under a second unloaded


def wait_for(cond, what: str, timeout: float = DEADLINE_S) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        time.sleep(0.01)


def chunk_ids(path) -> set[str]:
    return {c["chunk_id"] for c in load_bundle(path, verify=False).chunks}


def reload(client, path, headers: dict):
    return client.post("/v1/admin/reload", json={"bundle": str(path)}, headers=headers)


def test_reload_under_load_loses_no_request_and_refuses_bad_bundles(server, bundle_dir, bundle_b, refused_bundles,
                                                                   admin_headers):
    ids = {load_bundle(p, verify=False).version: chunk_ids(p) for p in (bundle_dir, bundle_b)}
    version_a, version_b = (load_bundle(p, verify=False).version for p in (bundle_dir, bundle_b))
    log: list[tuple[float, int, dict]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def load(i: int) -> None:
        n = 0
        while not stop.is_set():
            sent = time.monotonic()
            try:
                r = server.post("/v1/infer", json={"inputs": [f"can my dog travel on the ferry? ({i}.{n})"],
                                                   "evidence": 3})
                log.append((sent, r.status_code, r.json()))
            except BaseException as e:  # a lost request is a failure, whatever its form
                errors.append(e)
            n += 1

    def answered_since(t: float) -> bool:  # a request sent after t has been answered
        return any(sent > t for sent, _, _ in list(log)) or bool(errors)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(log) >= 4 or errors, "4 requests answered before the swap")  # load running, on A
        r = reload(server, bundle_b, admin_headers)
        swapped = time.monotonic()
        assert r.status_code == 200
        assert (r.json()["previous_version"], r.json()["bundle_version"]) == (version_a, version_b)
        wait_for(lambda: answered_since(swapped), "a request sent after the swap answered")
        for kind, path in refused_bundles.items():
            r = reload(server, path, admin_headers)
            assert r.status_code == 422, kind
            err = r.json()["error"]
            assert (err["type"], err["field"]) == ("bundle_error", "bundle")
            assert ("sha256 mismatch" if kind == "corrupt" else "built with model weights") in err["message"]
        refused_done = time.monotonic()
        wait_for(lambda: answered_since(refused_done), "a request sent after the refused reloads answered")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        restored = reload(server, bundle_dir, admin_headers)
    assert restored.status_code == 200 and restored.json()["bundle_version"] == version_a
    assert errors == []
    assert log and all(status == 200 for _, status, _ in log)
    versions = [body["bundle_version"] for _, _, body in log]
    assert version_a in versions and version_b in versions
    # after the swap (and the refused reloads) every request was answered by the new bundle
    assert {body["bundle_version"] for sent, _, body in log if sent > swapped} == {version_b}
    assert any(sent > refused_done for sent, _, _ in log)  # and some were sent after the refusals
    # and every answer drew its evidence from the bundle it names
    for _, _, body in log:
        for res in body["results"]:
            assert {e["chunk_id"] for e in res["evidence"]} <= ids[body["bundle_version"]]


def test_in_flight_request_finishes_on_the_bundle_it_started_with(running_app, make_settings, bundle_dir, bundle_b,
                                                                 admin_headers):
    version_a, version_b = (load_bundle(p, verify=False).version for p in (bundle_dir, bundle_b))
    # A micro-batch of 2 is taken when full (the 60 s wait to fill outlasts the test): a lone request
    # stays queued, pinned to bundle A, for as long as the reload takes, however slow the machine.
    # The reload's warm-up pass goes ahead of it (internal) without taking it along (another engine).
    with running_app(make_settings(batching={"max_batch_size": 2, "max_wait_ms": 60_000})) as client:
        runtime = client.app.state.runtime
        answer = {}
        first = threading.Thread(target=lambda: answer.update(
            r=client.post("/v1/infer", json={"inputs": ["dogs?"], "evidence": 2})))
        first.start()
        wait_for(lambda: runtime.batcher.depth() == 1, "the first request queued")  # admitted, pinned to A
        r = reload(client, bundle_b, admin_headers)
        assert r.status_code == 200 and r.json()["bundle_version"] == version_b
        assert runtime.batcher.depth() == 1 and "r" not in answer  # still queued: it runs after the swap
        # two requests on B: the first fills the queued request's batch (which runs it alone, on A:
        # a micro-batch never mixes engines), the second fills theirs
        with ThreadPoolExecutor(2) as pool:
            nxt = list(pool.map(lambda _: client.post("/v1/infer", json={"inputs": ["dogs?"], "evidence": 2}),
                                range(2)))
        first.join(DEADLINE_S)
        assert answer["r"].status_code == 200 and answer["r"].json()["bundle_version"] == version_a
        # computed on A, not only labelled A (the two bundles share no chunk id)
        assert {e["chunk_id"] for e in answer["r"].json()["results"][0]["evidence"]} <= chunk_ids(bundle_dir)
        assert client.get("/v1/index").json()["bundle_version"] == version_b
        for n in nxt:
            assert n.status_code == 200 and n.json()["bundle_version"] == version_b
            assert {e["chunk_id"] for e in n.json()["results"][0]["evidence"]} <= chunk_ids(bundle_b)


def test_refused_reload_keeps_the_old_bundle_serving(running_app, make_settings, bundle_dir, refused_bundles, tmp_path,
                                                    admin_headers):
    version_a = load_bundle(bundle_dir, verify=False).version
    with running_app(make_settings()) as client:
        for path in [*refused_bundles.values(), tmp_path / "missing"]:
            assert reload(client, path, admin_headers).status_code == 422
        r = reload(client, tmp_path / "missing", admin_headers)
        assert r.json() == {"error": {"type": "bundle_error", "field": "bundle",
                                      "message": f"{tmp_path / 'missing'}: not a bundle (no manifest.json)"}}
        assert client.get("/readyz").json()["bundle_version"] == version_a
        assert client.post("/v1/infer", json={"inputs": ["still here?"]}).json()["bundle_version"] == version_a
        assert 'softknn_reloads_total{kb="default",outcome="refused"} 4.0' in client.get("/metrics").text


def test_reload_request_is_strict(inproc, admin_headers):
    r = inproc.post("/v1/admin/reload", json={"bundle": "/x", "force": True}, headers=admin_headers)
    assert (r.status_code, r.json()["error"]["field"]) == (422, "force")
    r = inproc.post("/v1/admin/reload", json={"bundle": ""}, headers=admin_headers)
    assert (r.status_code, r.json()["error"]["field"]) == (422, "bundle")


def test_service_without_a_bundle_is_alive_not_ready_until_one_is_loaded(running_app, make_settings, bundle_b,
                                                                         admin_headers):
    with running_app(make_settings(bundle=None), ready=False) as client:
        wait_for(lambda: client.app.state.runtime.status != "starting", "start-up finished")
        assert client.get("/healthz").status_code == 200
        message = "no bundle configured (--bundle, SOFTKNN_BUNDLE); POST /v1/admin/reload one"
        not_ready = {"error": {"type": "not_ready", "message": message, "field": None}}
        assert (client.get("/readyz").status_code, client.get("/readyz").json()) == (503, not_ready)
        r = client.post("/v1/infer", json={"inputs": ["anyone?"]})
        assert (r.status_code, r.json()) == (503, not_ready)
        assert reload(client, bundle_b, admin_headers).status_code == 200
        assert client.get("/readyz").status_code == 200


def test_startup_with_a_corrupt_bundle_is_reported_by_health(running_app, make_settings, refused_bundles):
    with running_app(make_settings(bundle=refused_bundles["corrupt"]), ready=False) as client:
        wait_for(lambda: client.app.state.runtime.status != "starting", "start-up finished")
        for path in ("/healthz", "/readyz"):
            r = client.get(path)
            assert r.status_code == 503
            assert "sha256 mismatch" in r.json()["error"]["message"]
        assert client.get("/healthz").json()["error"]["type"] == "startup_failed"


class _SlowCluster:
    """A stand-in for a Ray deployment's ReplicaLink (Runtime's `cluster`) whose load takes a while:
    it waits, then opens and installs the bundle, as ReplicaLink.start does with the coordinator's."""

    def __init__(self, path, wait_s: float):
        self.path, self.wait_s, self.stopped = path, wait_s, False

    async def start(self, runtime) -> None:
        import asyncio

        await asyncio.sleep(self.wait_s)
        engine = await runtime.open(self.path)
        runtime.install(engine, await runtime.generation.open(engine))

    def stop(self) -> None:
        self.stopped = True


def test_a_replica_of_a_cluster_finishes_startup_only_once_its_bundle_is_loaded(encoder, make_settings, bundle_dir):
    """In a Ray deployment Serve routes requests only to replicas whose ASGI startup has finished; a
    replica that finished it while still loading would take requests beside a ready one and answer
    503 not_ready. So with a cluster the startup waits for the load: the first request is answered."""
    from fastapi.testclient import TestClient

    from softknn.service.app import create_app

    cluster = _SlowCluster(bundle_dir, wait_s=1.0)
    app = create_app(make_settings(), encoder=encoder, cluster=cluster)
    with TestClient(app) as client:  # returns once the lifespan's startup has finished
        assert client.app.state.runtime.status == "ready"
        assert client.get("/readyz").status_code == 200
        r = client.post("/v1/infer", json={"inputs": ["can my dog travel on the ferry?"]})
        assert r.status_code == 200 and r.json()["bundle_version"] == load_bundle(bundle_dir, verify=False).version
    assert cluster.stopped
