"""Overload (issue 7): with the queue full, new requests get 429 + Retry-After within milliseconds;
once the load drops, latency returns to what it was before (no stuck state).

A real server process with a 4-text queue and one text per micro-batch. Eight "filler" clients keep
heavy requests (a 90-token text, k = 64, exact search) queued back to back; a probe sends a light
request every 10 ms and times the refusals. Before and after, 20 light requests one at a time give
the unloaded latency.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.live_server import API_KEY, LiveServer, latency_summary
from tests.reliability.conftest import bearer

pytestmark = pytest.mark.slow

LONG = ("The relief vessel takes over the Amber Line whenever the flagship is in dry dock, and her timetable "
        "is posted at every ticket office a week ahead, together with the changes to vehicle bookings. ") * 2
HEAVY = {"inputs": [LONG], "k": 64, "exact": True, "evidence": 1}
LIGHT = {"inputs": ["Can I bring my dog?"], "evidence": 1}
QUEUE = 4


async def quiet_latency(c: httpx.AsyncClient, n: int = 20) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.post("/v1/infer", json=LIGHT)
        assert r.status_code == 200, r.text
        out.append(time.perf_counter() - t0)
    return out


async def filler(url: str, stop: asyncio.Event, counts: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=bearer(API_KEY)) as c:
        while not stop.is_set():
            r = await c.post("/v1/infer", json=HEAVY)
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            if r.status_code == 429:
                await asyncio.sleep(0.005)


async def scenario(url: str, depth) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=bearer(API_KEY)) as c:
        before = await quiet_latency(c)
        stop, filled = asyncio.Event(), {}
        fillers = [asyncio.create_task(filler(url, stop, filled)) for _ in range(8)]
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(depth) < QUEUE - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        refused, admitted, retry_after = [], [], set()
        t_end = time.monotonic() + 4.0
        while time.monotonic() < t_end:
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
        stop.set()
        await asyncio.gather(*fillers)
        t_drop = time.monotonic()
        while await asyncio.to_thread(depth) > 0:
            await asyncio.sleep(0.01)
        drained_s = time.monotonic() - t_drop
        after = await quiet_latency(c)
    return {"before": before, "after": after, "refused": refused, "admitted": admitted,
            "retry_after": retry_after, "fillers": filled, "drained_s": drained_s}


def test_full_queue_refuses_in_milliseconds_and_latency_recovers(sample_bundle_path, tmp_path, write_figure):
    env = {"SOFTKNN_BATCHING__QUEUE_SIZE": str(QUEUE), "SOFTKNN_BATCHING__MAX_BATCH_SIZE": "1",
           "SOFTKNN_BATCHING__MAX_WAIT_MS": "0"}
    with LiveServer.start(sample_bundle_path, tmp_path / "server.log", env=env) as srv:
        out = asyncio.run(scenario(srv.url, lambda: srv.metric("softknn_queue_depth")))
        depth_after = srv.metric("softknn_queue_depth")
        queue_full = srv.metric("softknn_rejected_total", reason="queue_full")
        ready_after = srv.client.get("/readyz").status_code
    before, after, refused = (latency_summary(out[k]) for k in ("before", "after", "refused"))
    figure = {"queue_size": QUEUE, "fillers": 8, "filler_statuses": {str(k): v for k, v in out["fillers"].items()},
              "refusals_429": refused, "probes_admitted": len(out["admitted"]),
              "retry_after_values": sorted(out["retry_after"]), "queue_full_metric": queue_full,
              "light_latency_before": before, "light_latency_after": after,
              "seconds_to_drain": round(out["drained_s"], 2), "queue_depth_after": depth_after,
              "ready_after": ready_after}
    write_figure("overload", figure)
    assert refused["n"] >= 50, figure
    assert refused["p99_ms"] < 100 and refused["p50_ms"] < 25, refused  # milliseconds, even on 2 busy cores
    assert all(v.isdigit() and int(v) >= 1 for v in out["retry_after"])
    assert depth_after == 0 and ready_after == 200
    assert after["p50_ms"] < 2 * before["p50_ms"] + 20, (before, after)  # back to normal: no stuck state
