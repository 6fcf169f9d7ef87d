"""Micro-batching under load: concurrent answers equal solo answers; backpressure; deadlines."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from softknn.infer.engine import InferParams
from softknn.service.batching import DEADLINE_MESSAGE

LONG = ("The relief vessel takes over the Amber Line whenever the flagship is in dry dock, and her timetable "
        "is posted at every ticket office a week ahead, together with the changes to vehicle bookings. ") * 2


def mixed_requests(queries: list[str]) -> list[dict]:
    """64 request bodies that differ in every parameter the contract has; some carry several inputs."""
    # sizes kept small (k ≤ 8, few long texts): the suite runs on a shared 2-core box
    alphas, ks, temps = [0.0, 0.3, 0.7, 1.0], [1, 2, 4, 8], [0.05, 0.2, 1.0]
    kernels = ["softmax", "softmax", "epanechnikov", "uniform"]
    bodies = []
    for i in range(64):
        n_inputs = 1 + (i % 8 == 0)
        inputs = [queries[(3 * i + j) % len(queries)] for j in range(n_inputs)]
        if i % 16 == 0:
            inputs.append(LONG)
        kernel = kernels[i % 4]
        bodies.append({
            "inputs": inputs,
            "alpha": alphas[i % 4],
            "mixing": "joint" if i % 3 == 0 else "fixed",
            "k": ks[i % 4],
            "temperature": 2.0 if kernel != "softmax" and i % 8 < 4 else temps[i % 3],
            "kernel": kernel,
            "exact": i % 2 == 0,
            "threshold": 0.1 if i % 16 == 1 else None,
            "evidence": i % 6,
            "spans": i % 4,
            "return_tokens": i % 10 == 3,
        })
    return bodies


def params_of(body: dict) -> InferParams:
    return InferParams(**{k: v for k, v in body.items() if k != "inputs"})


@pytest.fixture(scope="module")
def solo(queries, engine):
    """The 64 bodies and, per body, each input's answer from the engine run alone."""
    bodies = mixed_requests(queries)
    return bodies, [[engine.infer([t], params_of(b))[0] for t in b["inputs"]] for b in bodies]


def test_64_concurrent_mixed_requests_equal_their_solo_answers(api, solo, engine, assert_same):
    bodies, answers = solo
    bad = [{"inputs": [""]}, {"inputs": ["x"], "k": 0}, {"inputs": ["x"], "alpha": float("inf")}]
    work = [(b, 200) for b in bodies] + [(b, 422) for b in bad]
    work = work[::2] + work[1::2]  # bad requests in the middle of the load

    def send(item):
        body, _ = item
        if body.get("alpha") == float("inf"):
            return api.post("/v1/infer", content=b'{"inputs": ["x"], "alpha": Infinity}',
                            headers={"content-type": "application/json"})
        return api.post("/v1/infer", json=body)

    before = batch_stats(api)
    with ThreadPoolExecutor(len(work)) as pool:
        responses = list(pool.map(send, work))
    after = batch_stats(api)
    assert [r.status_code for r in responses] == [status for _, status in work]
    got = {id(b): r.json() for (b, _), r in zip(work, responses, strict=True)}
    for body, want in zip(bodies, answers, strict=True):
        out = got[id(body)]
        assert out["bundle_version"] == engine.bundle.version
        assert len(out["results"]) == len(want)
        for res, ref in zip(out["results"], want, strict=True):
            assert_same(res, ref)
    texts = sum(len(b["inputs"]) for b in bodies)
    assert after[1] - before[1] == texts  # every text ran exactly once
    assert after[0] - before[0] < texts  # in fewer micro-batches than texts: it really batched


def test_two_workers_share_the_queue_and_answer_like_one(running_app, make_settings, solo, engine, assert_same):
    """batching.workers = 2: both worker threads run micro-batches, concurrently, and every answer
    still equals the engine's solo answer (the hook is per thread, the tokenizer locked).

    "Concurrently" is not left to the scheduler (on a loaded 2-core box one worker could
    finish every batch before the other one woke): the first micro-batch waits, before it runs, until
    a second one has entered the runner. Only the other worker can bring it there (this one is held),
    so the rendezvous happens if and only if the two workers really take micro-batches at the same
    time; it fails (after 20 s, before the requests' own 30 s deadline) if they are serialised."""
    import threading

    bodies, answers = solo
    with running_app(make_settings(batching={"workers": 2})) as client:
        batcher = client.app.state.runtime.batcher
        assert [t.name for t in batcher._threads] == ["softknn-infer-0", "softknn-infer-1"]
        real, seen, lock = batcher.runner, [], threading.Lock()
        running = [0]
        both_in_flight = threading.Barrier(2, timeout=20)  # the first two micro-batches meet here
        met: list[bool] = []

        def runner(engine_, texts, params):
            with lock:
                running[0] += 1
                seen.append((threading.current_thread().name, running[0]))
                rendezvous = len(seen) <= 2
            try:
                if rendezvous:
                    try:
                        both_in_flight.wait()
                        met.append(True)
                    except threading.BrokenBarrierError:  # recorded, not raised: the batcher would rerun
                        met.append(False)
                return real(engine_, texts, params)
            finally:
                with lock:
                    running[0] -= 1

        batcher.runner = runner
        with ThreadPoolExecutor(len(bodies)) as pool:
            responses = list(pool.map(lambda b: client.post("/v1/infer", json=b), bodies))
    assert met == [True, True], "the two workers never ran micro-batches at the same time"
    assert [r.status_code for r in responses] == [200] * len(bodies)
    for r, want in zip(responses, answers, strict=True):
        for res, ref in zip(r.json()["results"], want, strict=True):
            assert_same(res, ref)
    assert {name for name, _ in seen} == {"softknn-infer-0", "softknn-infer-1"}
    assert max(n for _, n in seen) == 2  # two micro-batches were in flight at once


def batch_stats(client) -> tuple[float, float]:
    """(micro-batches run, texts run) so far, from /metrics."""
    text = client.get("/metrics").text
    count = float(re.search(r"^softknn_batch_size_count (\S+)$", text, re.M).group(1))
    total = float(re.search(r"^softknn_batch_size_sum (\S+)$", text, re.M).group(1))
    return count, total


def test_an_engine_failure_is_a_500_for_that_request_only(running_app, make_settings):
    # the three texts always share one micro-batch (it is taken when full, not after a wait that a
    # slow machine could outlast), so the failure really hits batch-mates and their rerun is tested
    with running_app(make_settings(batching={"max_batch_size": 3, "max_wait_ms": 60_000})) as client:
        batcher = client.app.state.runtime.batcher
        real, batches = batcher.runner, []

        def runner(engine, texts, params):
            batches.append(sorted(texts))
            if "explode" in texts:
                raise RuntimeError("a bug in the core")
            return real(engine, texts, params)

        batcher.runner = runner
        with ThreadPoolExecutor(3) as pool:
            good1, bad, good2 = pool.map(lambda t: client.post("/v1/infer", json={"inputs": [t]}),
                                         ["fine one", "explode", "fine two"])
        assert (good1.status_code, good2.status_code) == (200, 200)
        assert (bad.status_code, bad.json()) == (500, {"error": {
            "type": "inference_error", "field": None,
            "message": "inference failed (RuntimeError); see the server log for this request id"}})
        assert batches[0] == ["explode", "fine one", "fine two"]  # they did share the failing batch


def burst(client, n: int, headers: dict | None = None) -> list:
    body = {"inputs": [LONG], "k": 64, "exact": True, "evidence": 1}
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: client.post("/v1/infer", json=body, headers=headers), range(n)))


def assert_some_refused_with_retry_after(responses) -> None:
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
    for r in responses:
        if r.status_code == 429:
            assert r.json() == {"error": {"type": "queue_full", "field": None,
                                          "message": "queue full: 1 texts waiting, limit 1; retry later"}}
            assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1


def test_full_queue_gives_429_with_retry_after_then_recovers(running_app, make_settings):
    settings = make_settings(batching={"queue_size": 1, "max_batch_size": 1, "max_wait_ms": 0})
    with running_app(settings) as client:
        assert_some_refused_with_retry_after(burst(client, 12))
        assert client.post("/v1/infer", json={"inputs": ["after the burst"]}).status_code == 200
        assert 'softknn_rejected_total{reason="queue_full"}' in client.get("/metrics").text


def test_full_queue_gives_429_over_real_http(auth_server):
    responses = burst(auth_server, 12, headers={"Authorization": f"Bearer {auth_server.api_key}"})
    assert_some_refused_with_retry_after(responses)


def test_request_past_its_deadline_is_503_and_never_computed(running_app, make_settings):
    # the worker waits up to 60 s to fill a batch, so the request cannot start before its 0.3 s
    # deadline however late the event loop gets to the timeout on a loaded machine
    settings = make_settings(batching={"request_timeout_s": 0.3, "max_wait_ms": 60_000})
    with running_app(settings) as client:
        r = client.post("/v1/infer", json={"inputs": ["will this wait too long?"]})
        assert (r.status_code, r.json()) == (503, {"error": {"type": "timeout", "message": DEADLINE_MESSAGE,
                                                             "field": None}})
        assert r.headers["retry-after"].isdigit()
        metrics = client.get("/metrics").text
        assert "softknn_batch_size_count 1.0" in metrics  # the warm-up pass only: the work was dropped
        assert 'softknn_rejected_total{reason="deadline"} 1.0' in metrics
        assert client.app.state.runtime.batcher.depth() == 0
