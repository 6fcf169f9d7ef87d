"""Overload: with the queue full, new requests get 429 + Retry-After within milliseconds;
once the load drops, latency returns to what it was before (no stuck state).

A real server process with a 4-text queue and one text per micro-batch. Eight "filler" clients keep
heavy requests (a 90-token text, k = 64, exact search) queued back to back; a probe sends a light
request every 10 ms or so (alternating with a control, below) and times the refusals, until it has
REFUSALS of them. Before and after, 20 light requests one at a time give the unloaded latency.

What "within milliseconds" and "returns to what it was" mean is measured in the same run, under
whatever else the machine is doing (on a loaded 2-core CI box a fixed bound on the refusals' p50
fails while the service behaves exactly as designed; docs/reliability.md):
  * a refusal costs what a request refused by validation costs: a control request (the same body
    with k = 0, 422) alternates with the probes, on the same connection and route; the 429 path adds
    only tokenising the text and one comparison under the queue lock to it;
  * no refusal waits for a forward pass: the refusals' p95 stays under half, and their p99 under
    all, of the mean micro-batch time the server itself measured over the overload
    (softknn_inference_seconds); a refusal that waited for the worker, or an event loop blocked by
    inference, would put them at a whole forward pass or at half of it on average;
  * recovery is judged against a twin: a second server process, identical, that never saw the
    overload; light requests alternate between the two after the overload, so a change in the
    machine's load hits both alike and only a stuck state in the overloaded one shows.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.harness import API_KEY, LiveServer, latency_summary
from tests.reliability.conftest import bearer

pytestmark = pytest.mark.slow

LONG = ("The relief vessel takes over the Amber Line whenever the flagship is in dry dock, and her timetable "
        "is posted at every ticket office a week ahead, together with the changes to vehicle bookings. ") * 2
HEAVY = {"inputs": [LONG], "k": 64, "exact": True, "evidence": 1}
LIGHT = {"inputs": ["Can I bring my dog?"], "evidence": 1}
CONTROL = {**LIGHT, "k": 0}  # refused by validation (422): no tokenising, no queue
QUEUE = 4
REFUSALS = 60  # probes refused before the probing stops (at most PROBE_DEADLINE_S of it)
PROBE_DEADLINE_S = 120.0


async def light(c: httpx.AsyncClient) -> float:
    t0 = time.perf_counter()
    r = await c.post("/v1/infer", json=LIGHT)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0


async def quiet_latency(c: httpx.AsyncClient, twin: httpx.AsyncClient, n: int = 20) -> tuple[list, list]:
    """n light requests one at a time to each server, alternating (and alternating which goes first)."""
    out, ref = [], []
    for i in range(n):
        if i % 2:
            ref.append(await light(twin))
            out.append(await light(c))
        else:
            out.append(await light(c))
            ref.append(await light(twin))
    return out, ref


async def filler(url: str, stop: asyncio.Event, counts: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=bearer(API_KEY)) as c:
        while not stop.is_set():
            r = await c.post("/v1/infer", json=HEAVY)
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            if r.status_code == 429:
                await asyncio.sleep(0.005)


async def until(cond, what: str, timeout: float = 60.0) -> None:
    """Poll the (blocking) cond in a thread until true; fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not await asyncio.to_thread(cond):
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


async def scenario(url: str, twin_url: str, metric) -> dict:
    async with (httpx.AsyncClient(base_url=url, timeout=120, headers=bearer(API_KEY)) as c,
                httpx.AsyncClient(base_url=twin_url, timeout=120, headers=bearer(API_KEY)) as twin):
        before, twin_before = await quiet_latency(c, twin)
        work0 = [await asyncio.to_thread(metric, f"softknn_inference_seconds_{x}") for x in ("sum", "count")]
        stop, filled = asyncio.Event(), {}
        fillers = [asyncio.create_task(filler(url, stop, filled)) for _ in range(8)]
        await until(lambda: metric("softknn_queue_depth") >= QUEUE - 1, "the fillers filled the queue")
        refused, controls, admitted, retry_after = [], [], [], set()
        deadline = time.monotonic() + PROBE_DEADLINE_S
        while len(refused) < REFUSALS and time.monotonic() < deadline:
            t0 = time.perf_counter()
            r = await c.post("/v1/infer", json=LIGHT)
            dt = time.perf_counter() - t0
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "queue_full"
                refused.append(dt)
                retry_after.add(r.headers["retry-after"])
            else:
                assert r.status_code == 200, r.text
                admitted.append(dt)
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            r = await c.post("/v1/infer", json=CONTROL)
            controls.append(time.perf_counter() - t0)
            assert (r.status_code, r.json()["error"]["field"]) == (422, "k"), r.text
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*fillers)
        t_drop = time.monotonic()
        await until(lambda: metric("softknn_queue_depth") == 0, "the queue drained after the fillers stopped")
        drained_s = time.monotonic() - t_drop
        # every micro-batch of the overload (the fillers' last requests included: at least a queue's worth)
        work1 = [await asyncio.to_thread(metric, f"softknn_inference_seconds_{x}") for x in ("sum", "count")]
        after, twin_after = await quiet_latency(c, twin)
    batches = work1[1] - work0[1]
    return {"before": before, "twin_before": twin_before, "after": after, "twin_after": twin_after,
            "refused": refused, "controls": controls, "admitted": admitted, "retry_after": retry_after,
            "fillers": filled, "drained_s": drained_s, "batches_overload": batches,
            "mean_batch_s": (work1[0] - work0[0]) / batches if batches else float("nan")}


def test_full_queue_refuses_in_milliseconds_and_latency_recovers(sample_bundle_path, tmp_path, write_figure):
    env = {"SOFTKNN_BATCHING__QUEUE_SIZE": str(QUEUE), "SOFTKNN_BATCHING__MAX_BATCH_SIZE": "1",
           "SOFTKNN_BATCHING__MAX_WAIT_MS": "0"}
    with (LiveServer.start(sample_bundle_path, tmp_path / "server.log", env=env) as srv,
          LiveServer.start(sample_bundle_path, tmp_path / "twin.log", env=env) as twin):
        out = asyncio.run(scenario(srv.url, twin.url, srv.metric))
        depth_after = srv.metric("softknn_queue_depth")
        queue_full = srv.metric("softknn_rejected_total", reason="queue_full")
        ready_after = srv.client.get("/readyz").status_code
    before, after, refused, control, twin_before, twin_after = (latency_summary(out[k]) for k in (
        "before", "after", "refused", "controls", "twin_before", "twin_after"))
    mean_batch_ms = round(out["mean_batch_s"] * 1e3, 2)
    figure = {"queue_size": QUEUE, "fillers": 8, "filler_statuses": {str(k): v for k, v in out["fillers"].items()},
              "refusals_429": refused, "validation_422_alongside": control, "probes_admitted": len(out["admitted"]),
              "mean_micro_batch_ms_overload": mean_batch_ms, "micro_batches_overload": out["batches_overload"],
              "retry_after_values": sorted(out["retry_after"]), "queue_full_metric": queue_full,
              "light_latency_before": before, "light_latency_after": after,
              "twin_light_latency_before": twin_before, "twin_light_latency_after": twin_after,
              "seconds_to_drain": round(out["drained_s"], 2), "queue_depth_after": depth_after,
              "ready_after": ready_after}
    write_figure("overload", figure)
    assert refused["n"] >= REFUSALS, figure  # the full queue kept refusing
    # as fast as a validation error on the same route, alongside (2× and 5 ms: noise between two
    # samples of 60; the 429 path adds microseconds of work to the 422 path)
    assert refused["p50_ms"] < 2 * control["p50_ms"] + 5, (refused, control)
    # and never behind a forward pass (a micro-batch here is one 90-token text, k = 64, exact)
    assert out["batches_overload"] >= QUEUE, figure
    assert refused["p95_ms"] < mean_batch_ms / 2 and refused["p99_ms"] < mean_batch_ms, (refused, mean_batch_ms)
    assert all(v.isdigit() and int(v) >= 1 for v in out["retry_after"])
    assert depth_after == 0 and ready_after == 200
    # back to normal, no stuck state: as fast as the twin that never saw the overload, measured
    # alongside (the tolerance is the one this test always had against its own "before")
    assert after["p50_ms"] < 2 * twin_after["p50_ms"] + 20, (after, twin_after, before)
