"""Micro-batching: concurrent requests queue up and one inference worker thread runs them together.

Why one thread by default: the model already uses the cores through torch's intra-op pool; a
second concurrent forward only fights it for them. Oversubscription is the failure mode on a
shared box: a second torch thread per forward cuts throughput by an order of magnitude there
(settings.model.threads; docs/benchmarks.md has the figures). So inference happens
only on the worker threads — warm-up passes included — and the event loop only admits, waits and
answers. `batching.workers` > 1 runs that many workers, each taking the next micro-batch when it
is free: for model.threads = 1 (one core per forward), so that a machine's other cores are used
(docs/benchmarks.md measures it). Each pass is independent: the layer hook is a context variable
(per thread) and the tokenizer is locked (Encoder.tokenize).

The queue holds texts, not requests: a request with many inputs may span several micro-batches.
A micro-batch takes texts in arrival order while all of these hold (the first text always goes):
    len(batch) ≤ max_batch_size
    len(batch) · max_T ≤ max_batch_tokens                     padded tokens of the forward pass
    len(batch) · max_T · max_S ≤ max_batch_tokens · slot_unit  the fused layer's (T × S × Lm) tensors
where T is a text's token count and S its retrieved-chunk slots (k, or the hybrid pool), and
slot_unit is the default k (so a batch of default-k requests is bound by the token budget alone).
Every text of a micro-batch belongs to requests pinned to the same engine (model + bundle), so a
request admitted before a reload finishes on the bundle it started with.

Backpressure: admission is refused with QueueFull (429 + Retry-After) when the waiting texts
would exceed queue_size. Deadlines: a request not started by its deadline is dropped from the
queue and answered DeadlineExceeded (503); its work is never done. Results of a text do not
depend on its batch-mates beyond float round-off (tests check ≤ 1e-5 against solo runs).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from softknn.service.errors import DeadlineExceeded, QueueFull, ShuttingDown

log = logging.getLogger("softknn.service.batching")

DEADLINE_MESSAGE = "request not started before its deadline (batching.request_timeout_s); dropped from the queue"

# runner(engine, texts, params) -> one result per text; runs on the worker thread.
Runner = Callable[[Any, list[str], list[Any]], list[Any]]


@dataclass(eq=False)
class Job:
    """One request: its texts, per-text params and costs, the engine it is pinned to."""

    engine: Any
    texts: list[str]
    params: list[Any]
    tokens: list[int]  # padded-length cost of each text
    slots: list[int]  # memory slots S of each text
    deadline: float  # time.monotonic() by which it must have started
    request_id: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)
    internal: bool = False  # the service's own pass (warm-up): ahead of the queue, never waits to fill
    state: str = "queued"  # queued → running → done | failed | dropped
    results: list = field(default_factory=list)
    pending: int = 0


@dataclass(eq=False)
class Item:
    job: Job
    index: int  # which text of the job

    @property
    def tokens(self) -> int:
        return self.job.tokens[self.index]

    @property
    def slots(self) -> int:
        return self.job.slots[self.index]


class Batcher:
    """A bounded text queue and the one worker thread that drains it in micro-batches."""

    def __init__(self, *, max_batch_size: int, max_batch_tokens: int, max_wait_ms: float, queue_size: int,
                 runner: Runner, slot_unit: int = 8, metrics=None, name: str = "softknn-infer", workers: int = 1):
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.queue_size = queue_size
        self.slot_budget = max_batch_tokens * max(1, slot_unit)
        self.runner = runner
        self.metrics = metrics
        self._queue: deque[Item] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._sec_per_text = 0.05  # running estimate, for Retry-After
        self._threads = [threading.Thread(target=self._loop, name=name if workers == 1 else f"{name}-{i}", daemon=True)
                         for i in range(max(1, workers))]

    # --- event-loop side ----------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def depth(self) -> int:
        """Texts waiting (not yet taken into a batch)."""
        return len(self._queue)

    async def run(self, engine, texts: Sequence[str], params: Sequence[Any], tokens: Sequence[int],
                  slots: Sequence[int], *, timeout: float, request_id: str | None = None,
                  internal: bool = False) -> list:
        """Queue one request and wait for its results; QueueFull / DeadlineExceeded / ShuttingDown.

        `internal` (the service's own warm-up passes) goes ahead of the queue and past its limit.
        """
        loop = asyncio.get_running_loop()
        job = Job(engine, list(texts), list(params), list(tokens), list(slots), time.monotonic() + timeout,
                  request_id, loop, loop.create_future(), internal=internal)
        # mark a late exception as retrieved when nobody waits any more (dropped, disconnected)
        job.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        job.results = [None] * len(job.texts)
        job.pending = len(job.texts)
        self._submit(job)
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout=max(timeout, 0.0))
        except TimeoutError:
            if self._drop(job):
                self._count("deadline")
                raise DeadlineExceeded(DEADLINE_MESSAGE, headers={"Retry-After": self.retry_after()}) from None
            return await job.future  # already running: its answer is near
        except asyncio.CancelledError:  # the client went away: do not compute for nobody
            self._drop(job)
            raise

    def _submit(self, job: Job) -> None:
        n = len(job.texts)
        with self._cond:
            if self._closed:
                raise ShuttingDown("the service is shutting down")
            if job.internal:
                self._queue.extendleft(Item(job, i) for i in reversed(range(n)))
                self._cond.notify()
                return
            # A request larger than the whole queue is admitted when the queue is empty (else never).
            if self._queue and len(self._queue) + n > self.queue_size:
                waiting = len(self._queue)
                self._count("queue_full")
                raise QueueFull(f"queue full: {waiting} texts waiting, limit {self.queue_size}; retry later",
                                headers={"Retry-After": self.retry_after(waiting)})
            self._queue.extend(Item(job, i) for i in range(n))
            self._cond.notify()
        self._gauge()

    def _drop(self, job: Job) -> bool:
        """Remove a job that has not started; False if it already has (it will finish)."""
        with self._cond:
            if job.state != "queued":
                return False
            job.state = "dropped"
            self._queue = deque(it for it in self._queue if it.job is not job)
            self._cond.notify()
        self._gauge()
        return True

    def retry_after(self, waiting: int | None = None) -> str:
        waiting = self.depth() if waiting is None else waiting
        return str(max(1, min(60, math.ceil(waiting * self._sec_per_text))))

    def close(self, timeout: float = 30.0) -> None:
        """Stop admitting; fail what still waits; let the running batch finish; join the worker."""
        with self._cond:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in {id(it.job): it.job for it in left}.values():
            self._fail(job, ShuttingDown("the service is shutting down"))
        end = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, end - time.monotonic()))

    # --- worker side --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._wait_to_fill()
                batch, expired = self._take()
                if self._queue and len(self._threads) > 1:
                    self._cond.notify()  # work left: another idle worker can take the next micro-batch
            self._gauge()
            for job in expired:
                self._count("deadline")
                self._fail(job, DeadlineExceeded(DEADLINE_MESSAGE, headers={"Retry-After": self.retry_after()}))
            if batch:
                try:
                    self._run(batch)
                except Exception as e:  # never let the one worker die; fail what it held
                    log.exception("inference worker error")
                    for job in {id(it.job): it.job for it in batch}.values():
                        self._fail(job, e)

    def _wait_to_fill(self) -> None:
        """Under the lock: wait until the oldest text has waited max_wait or the batch is full."""
        while self._queue and not self._closed and len(self._queue) < self.max_batch_size:
            if self._queue[0].job.internal:
                return
            left = self._queue[0].job.enqueued + self.max_wait - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _take(self) -> tuple[list[Item], list[Job]]:
        """Under the lock: pick the next micro-batch (see the module docstring) and expired jobs."""
        now = time.monotonic()
        batch: list[Item] = []
        expired: list[Job] = []
        keep: deque[Item] = deque()
        engine, max_t, max_s = None, 0, 0
        for it in self._queue:
            job = it.job
            if job.state in ("dropped", "failed"):
                continue
            if job.state == "queued" and job.deadline <= now:
                job.state = "dropped"
                expired.append(job)
                continue
            if len(batch) >= self.max_batch_size or (engine is not None and job.engine is not engine):
                keep.append(it)
                continue
            n, t, s = len(batch) + 1, max(max_t, it.tokens), max(max_s, it.slots)
            if batch and (n * t > self.max_batch_tokens or n * t * s > self.slot_budget):
                keep.append(it)
                continue
            batch.append(it)
            engine, max_t, max_s = job.engine, t, s
            if job.state == "queued":
                job.state = "running"
                if self.metrics is not None:
                    self.metrics.queue_wait.observe(now - job.enqueued)
        self._queue = keep
        if self.metrics is not None and batch:
            self.metrics.batch_tokens.observe(len(batch) * max_t)
        return batch, expired

    def _run(self, batch: list[Item]) -> None:
        jobs = list({id(it.job): it.job for it in batch}.values())
        t0 = time.perf_counter()
        try:
            results = self.runner(batch[0].job.engine, [it.job.texts[it.index] for it in batch],
                                  [it.job.params[it.index] for it in batch])
        except Exception as e:
            if len(jobs) > 1:  # one request's failure must cost the others nothing: rerun each alone
                log.warning("micro-batch failed (%s: %s); rerunning its %d requests one by one",
                            type(e).__name__, e, len(jobs))
                for job in jobs:
                    self._run([it for it in batch if it.job is job])
                return
            log.warning("inference failed: %s: %s", type(e).__name__, e, extra={"request_id": jobs[0].request_id})
            self._fail(jobs[0], e)
            return
        dt = time.perf_counter() - t0
        self._sec_per_text = 0.8 * self._sec_per_text + 0.2 * dt / len(batch)
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(batch))
            self.metrics.inference.observe(dt)
        log.debug("batch of %d texts from %d requests in %.1f ms", len(batch), len(jobs), dt * 1e3,
                  extra={"request_ids": [j.request_id for j in jobs]})
        for it, r in zip(batch, results, strict=True):
            job = it.job
            if job.state == "failed":
                continue
            job.results[it.index] = r
            job.pending -= 1
            if job.pending == 0:
                job.state = "done"
                self._resolve(job, result=job.results)

    def _fail(self, job: Job, exc: BaseException) -> None:
        with self._cond:
            if job.state in ("done", "failed"):
                return
            job.state = "failed"
            self._queue = deque(it for it in self._queue if it.job is not job)
        self._resolve(job, exc=exc)

    @staticmethod
    def _resolve(job: Job, *, result=None, exc: BaseException | None = None) -> None:
        def settle():
            if job.future.done():
                return
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)

        try:
            job.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()
