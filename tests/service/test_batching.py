"""The micro-batcher with a fake runner: batch formation, backpressure, deadlines, isolation.

No assertion here depends on how fast the machine is (CI runs on a loaded 2-core box).
Which texts share a micro-batch is made deterministic: a batch fills to exactly max_batch_size
(with a max_wait far longer than any test), or the worker is held in the runner (`gate`) until the
texts under test are all queued (`until(depth)`), so a preempted event loop can no longer let the
worker take a partial batch. Waits are on events and conditions with generous deadlines.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from softknn.service.batching import DEADLINE_MESSAGE, Batcher
from softknn.service.errors import DeadlineExceeded, QueueFull, ShuttingDown


class Recorder:
    """A runner that records each batch (engine, texts) and answers text.upper(); can be held."""

    def __init__(self, fail_on: str | None = None):
        self.batches: list[tuple[object, list[str]]] = []
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, engine, texts, params):
        self.started.set()
        assert self.gate.wait(60), "the test never opened the gate"
        self.batches.append((engine, list(texts)))
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError(f"cannot run {self.fail_on!r}")
        return [t.upper() for t in texts]


def make(runner, **kw) -> Batcher:
    cfg = {"max_batch_size": 8, "max_batch_tokens": 1000, "max_wait_ms": 20, "queue_size": 64, "slot_unit": 8}
    b = Batcher(runner=runner, **{**cfg, **kw})
    b.start()
    return b


async def submit(b: Batcher, engine, texts, tokens=None, slots=None, timeout=60.0):
    n = len(texts)
    return await b.run(engine, texts, [None] * n, tokens or [10] * n, slots or [8] * n, timeout=timeout)


LONG_WAIT_MS = 60_000  # "wait to fill" longer than any test: a batch forms when full, never on a timer


async def started(rec: Recorder) -> None:
    """The worker is inside the runner (held there while rec.gate is clear)."""
    assert await asyncio.to_thread(rec.started.wait, 60), "the worker never started a batch"


async def until(cond, what: str, timeout: float = 60.0) -> None:
    """Poll `cond()` on the event loop (yielding to the other tasks) until true; fail after `timeout`."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.001)


def test_concurrent_requests_share_a_batch_and_get_their_own_answers():
    rec = Recorder()
    # the worker waits until the batch is full (6 texts), however late the third request is queued
    b = make(rec, max_batch_size=6, max_wait_ms=LONG_WAIT_MS)

    async def main():
        return await asyncio.gather(*(submit(b, "E", [f"q{i}", f"r{i}"]) for i in range(3)))

    try:
        out = asyncio.run(main())
    finally:
        b.close()
    assert out == [["Q0", "R0"], ["Q1", "R1"], ["Q2", "R2"]]
    assert [len(t) for _, t in rec.batches] == [6]


def test_batches_respect_size_token_and_slot_budgets():
    rec = Recorder()
    rec.gate.clear()  # hold the worker on a first batch until all ten texts are queued
    b = make(rec, max_batch_size=3, max_batch_tokens=100, slot_unit=8)

    async def main():
        plug = asyncio.ensure_future(submit(b, "E", ["plug"]))
        await started(rec)
        work = asyncio.gather(
            submit(b, "E", ["a", "b", "c", "d"], tokens=[10, 10, 10, 10]),  # size: 3, then d
            submit(b, "E", ["long1", "long2"], tokens=[60, 60]),  # 2·60 > 100 padded tokens: one each
            submit(b, "E", ["wide1", "wide2"], tokens=[10, 10], slots=[48, 48]),  # 2·10·48 > 100·8 slot budget
            submit(b, "E", ["s1", "s2"], tokens=[40, 40], slots=[8, 8]),  # 2·40 ≤ 100, 2·40·8 ≤ 800: together
        )
        await until(lambda: b.depth() == 10, "all ten texts queued")
        rec.gate.set()
        return await plug, await work

    try:
        asyncio.run(main())
    finally:
        b.close()
    # in arrival order; a text that would break the budget waits for the next batch
    assert [t for _, t in rec.batches] == [["plug"], ["a", "b", "c"], ["d", "s1"], ["long1"], ["long2"], ["wide1"],
                                           ["wide2"], ["s2"]]


def test_a_batch_never_mixes_engines_and_each_request_runs_on_its_own():
    rec = Recorder()
    rec.gate.clear()  # hold the worker until x, y and z are all queued: they could share one batch
    b = make(rec)

    async def main():
        plug = asyncio.ensure_future(submit(b, "plug", ["plug"]))
        await started(rec)
        work = asyncio.gather(submit(b, "old", ["x"]), submit(b, "new", ["y"]), submit(b, "old", ["z"]))
        await until(lambda: b.depth() == 3, "x, y and z queued")
        rec.gate.set()
        await plug
        return await work

    try:
        out = asyncio.run(main())
    finally:
        b.close()
    assert out == [["X"], ["Y"], ["Z"]]
    assert rec.batches == [("plug", ["plug"]), ("old", ["x", "z"]), ("new", ["y"])]


def test_full_queue_refuses_with_retry_after():
    rec = Recorder()
    rec.gate.clear()  # hold the worker on the first batch
    b = make(rec, max_batch_size=1, max_wait_ms=0, queue_size=2)

    async def main():
        first = asyncio.ensure_future(submit(b, "E", ["running"]))
        await started(rec)
        waiting = asyncio.ensure_future(submit(b, "E", ["w1", "w2"]))  # fills the queue (2 texts)
        await until(lambda: b.depth() == 2, "w1 and w2 queued")
        with pytest.raises(QueueFull) as e:
            await submit(b, "E", ["refused"])
        rec.gate.set()
        return e.value, await first, await waiting

    try:
        err, first, waiting = asyncio.run(main())
    finally:
        b.close()
    assert err.message == "queue full: 2 texts waiting, limit 2; retry later"
    assert err.headers["Retry-After"].isdigit() and int(err.headers["Retry-After"]) >= 1
    assert (first, waiting) == (["RUNNING"], ["W1", "W2"])
    assert ["refused"] not in [t for _, t in rec.batches]


def test_a_request_larger_than_the_queue_is_admitted_when_the_queue_is_empty():
    b = make(Recorder(), queue_size=2)
    try:
        assert asyncio.run(submit(b, "E", ["a", "b", "c"])) == ["A", "B", "C"]
    finally:
        b.close()


def test_past_deadline_is_503_and_its_work_is_never_done():
    rec = Recorder()
    rec.gate.clear()  # the worker is held on "busy": "late" cannot start, however slow the machine
    b = make(rec, max_batch_size=1, max_wait_ms=0)

    async def main():
        first = asyncio.ensure_future(submit(b, "E", ["busy"]))
        await started(rec)
        with pytest.raises(DeadlineExceeded) as e:
            await submit(b, "E", ["late"], timeout=0.05)
        depth_after_deadline = b.depth()
        rec.gate.set()
        await first
        # FIFO: had "late" stayed queued, the worker would run it before this one
        assert await submit(b, "E", ["sentinel"]) == ["SENTINEL"]
        return e.value, depth_after_deadline

    try:
        err, depth_after_deadline = asyncio.run(main())
    finally:
        b.close()
    assert err.message == DEADLINE_MESSAGE
    assert depth_after_deadline == 0  # dropped from the queue at its deadline
    assert [t for _, t in rec.batches] == [["busy"], ["sentinel"]]
    assert b.depth() == 0


def test_a_failing_request_costs_its_batch_mates_nothing():
    rec = Recorder(fail_on="bad")
    b = make(rec, max_batch_size=4, max_wait_ms=LONG_WAIT_MS)  # the 4 texts always form one batch

    async def main():
        return await asyncio.gather(submit(b, "E", ["good1"]), submit(b, "E", ["bad", "x"]), submit(b, "E", ["good2"]),
                                    return_exceptions=True)

    try:
        good1, bad, good2 = asyncio.run(main())
    finally:
        b.close()
    assert (good1, good2) == (["GOOD1"], ["GOOD2"])
    assert isinstance(bad, ValueError) and str(bad) == "cannot run 'bad'"
    # the shared batch failed, then each request ran alone
    assert [t for _, t in rec.batches] == [["good1", "bad", "x", "good2"], ["good1"], ["bad", "x"], ["good2"]]


def test_close_fails_waiting_requests_and_refuses_new_ones():
    rec = Recorder()
    rec.gate.clear()
    b = make(rec, max_batch_size=1, max_wait_ms=0)

    async def main():
        first = asyncio.ensure_future(submit(b, "E", ["busy"]))
        await started(rec)
        waiting = asyncio.ensure_future(submit(b, "E", ["queued"]))
        await until(lambda: b.depth() == 1, "'queued' queued")
        closing = asyncio.ensure_future(asyncio.to_thread(b.close))
        # close() has failed what waits (and is joining the held worker) before the worker is let go:
        # else the worker could take "queued" before close() reached the queue
        await asyncio.wait([waiting], timeout=60)
        assert waiting.done(), "close() did not fail the waiting request"
        rec.gate.set()
        await closing
        with pytest.raises(ShuttingDown):
            await waiting
        with pytest.raises(ShuttingDown):
            await submit(b, "E", ["after"])
        return await first

    assert asyncio.run(main()) == ["BUSY"]
    assert [t for _, t in rec.batches] == [["busy"]]


def test_internal_pass_goes_ahead_of_a_full_queue():
    rec = Recorder()
    rec.gate.clear()
    b = make(rec, max_batch_size=4, max_wait_ms=0, queue_size=2)

    async def main():
        first = asyncio.ensure_future(submit(b, "old", ["running"]))
        await started(rec)
        waiting = asyncio.ensure_future(submit(b, "old", ["w1", "w2"]))  # the queue is full
        await until(lambda: b.depth() == 2, "w1 and w2 queued")
        warm = asyncio.ensure_future(b.run("new", ["warm-up"], [None], [5], [8], timeout=60, internal=True))
        await until(lambda: b.depth() == 3, "the warm-up queued, past the full queue")
        rec.gate.set()
        return await first, await warm, await waiting

    try:
        assert asyncio.run(main()) == (["RUNNING"], ["WARM-UP"], ["W1", "W2"])
    finally:
        b.close()
    assert rec.batches == [("old", ["running"]), ("new", ["warm-up"]), ("old", ["w1", "w2"])]
