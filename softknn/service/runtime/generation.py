"""A KB's generation (Runtime's part, softknn.service.runtime.core): the GenEngine of the bundle serving
now, opened beside it, and the generate/answer streaming.

When the bundle's manifest has a generator record, its causal LM is loaded (once per name, kept
across reloads) and a GenEngine over the same Engine is installed with it. At most
`settings.generator.max_concurrent` generations run (`max_queue` wait, past it 429, GenSlots): each
retrieves on a generation thread, then decodes in the generator's decode loop, one batched step for
every running generation (softknn.generate.batch; fixed α and exact ones in torch on their thread);
`generate` streams each token to the event loop, and a consumer that stops (a client gone
mid-stream) cancels the generation at its next token, which frees its slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from softknn.common.errors import SoftKNNError
from softknn.generate.engine import GenAnswer, GenEngine, GenParams
from softknn.generate.model import Generator, Step
from softknn.infer.engine import Engine
from softknn.params import Settings
from softknn.service.errors import DeadlineExceeded, GeneratorUnavailable, InferenceFailed, QueueFull, ServiceError
from softknn.service.metrics import Metrics

log = logging.getLogger("softknn.service")


class GenSlots:
    """At most `running` generations at once and `waiting` more queued for a slot; past that QueueFull
    (429, Retry-After). Acquired on the event loop; released from a done callback on the loop."""

    def __init__(self, running: int, waiting: int, metrics: Metrics):
        self.size, self.max_waiting, self.metrics = running, waiting, metrics
        self._sem = asyncio.Semaphore(running)
        self.waiting = 0

    async def acquire(self, timeout: float) -> None:
        if self._sem.locked() and self.waiting >= self.max_waiting:
            self.metrics.rejected.labels("generation_queue_full").inc()
            raise QueueFull(f"generation queue full: {self.size} running, {self.waiting} waiting, limit "
                            f"{self.max_waiting}; retry later", headers={"Retry-After": str(1 + self.waiting)})
        self.waiting += 1
        self.metrics.generations_waiting.set(self.waiting)
        try:
            await asyncio.wait_for(self._sem.acquire(), timeout)
        except TimeoutError:
            self.metrics.rejected.labels("generation_timeout").inc()
            raise DeadlineExceeded(f"no generation slot within {timeout:g} s", headers={"Retry-After": "1"}) from None
        finally:
            self.waiting -= 1
            self.metrics.generations_waiting.set(self.waiting)
        self.metrics.generations_running.inc()

    def release(self) -> None:
        self.metrics.generations_running.dec()
        self._sem.release()


_END = object()


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class RuntimeGeneration:
    """Runtime's generation methods (a mixin of softknn.service.runtime.core.Runtime, which sets these)."""

    settings: Settings
    metrics: Metrics
    gen_slots: GenSlots
    _generators: dict[str, Generator]
    _gen: GenEngine | None
    _gen_reason: str
    _gen_pool: ThreadPoolExecutor

    if TYPE_CHECKING:
        def current(self) -> Engine: ...

    async def open_generation(self, engine: Engine) -> tuple[GenEngine | None, str]:
        """The GenEngine for `engine`'s bundle, or (None, why not). Never raises: a generator that does
        not load leaves /v1/infer serving and the generation routes answering generator_unavailable."""
        rec = engine.bundle.manifest.generator
        if rec is None:
            return None, (f"bundle {engine.bundle.version} was built without a generator "
                          "(softknn build KB --out DIR --generator smollm2-135m-instruct)")
        try:
            ge = await asyncio.to_thread(self._load_generation, engine)
        except Exception as e:
            reason = f"generator {self.settings.generator.name or rec.name} did not load: {type(e).__name__}: {e}"
            log.error(reason, exc_info=not isinstance(e, SoftKNNError))
            return None, reason
        return ge, ""

    def _load_generation(self, engine: Engine) -> GenEngine:
        t0 = time.perf_counter()
        rec = engine.bundle.manifest.generator
        if rec is None:
            raise GeneratorUnavailable(f"bundle {engine.bundle.version} was built without a generator")
        name = self.settings.generator.name or rec.name
        gen = self._generators.get(name)
        if gen is None and not self.settings.generator.name:  # a shared generator with the bundle's weights
            gen = next((g for g in self._generators.values() if g.info.fingerprint == rec.fingerprint), None)
        if gen is None:
            gen = Generator.load(name, cache_dir=self.settings.generator.cache_dir)
            self._generators[name] = gen
        g = self.settings.generator
        ge = GenEngine(engine, gen, runtime=g.runtime, weights=g.weights, threads=g.threads, max_batch=g.max_concurrent,
                       torch_concurrent=g.torch_concurrent, cache_mb=g.cache_mb)
        if g.runtime == "graph":  # the decode graph built and run once before /readyz, not on the first request
            ge.warm_up()
        log.info("generator loaded", extra={"generator": gen.info.name, "layers": len(ge.layers),
                                            "memory": ge.store.kind, "seconds": round(time.perf_counter() - t0, 2)})
        return ge

    # --- generation ---------------------------------------------------------------------------
    @property
    def served_generator(self) -> GenEngine | None:
        """The GenEngine serving now, or None (no generator, or it did not load)."""
        return self._gen

    def generation(self) -> GenEngine:
        """The GenEngine serving now; 503 until ready, 409 generator_unavailable without one."""
        self.current()
        ge = self._gen
        if ge is None:
            raise GeneratorUnavailable(f"no generator is served: {self._gen_reason}")
        return ge

    async def generate(self, ge: GenEngine, params: GenParams, prompt: str | None, messages: list[dict] | None,
                       *, request_id: str | None = None) -> AsyncGenerator[Step | GenAnswer, None]:
        """Wait for a slot (429 past the queue), then run `ge.stream` on a generation thread: yields
        each Step as it is chosen, then the GenAnswer. Closing this iterator early (a client gone)
        cancels the generation at its next token; the slot frees when its thread ends."""
        params = params.validate()  # 422 here, before a slot is taken
        start = time.monotonic()
        await self.gen_slots.acquire(self.settings.batching.request_timeout_s)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        metrics = self.metrics

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        def work() -> None:
            t0, first = time.monotonic(), True
            try:
                for item in ge.stream(params, prompt, messages, cancelled=cancel.is_set):
                    if isinstance(item, Step):
                        if first:
                            metrics.time_to_first_token.observe(time.monotonic() - start)
                            first = False
                    else:
                        metrics.generations.labels(item.finish_reason).inc()
                        metrics.generated_tokens.inc(item.usage["completion_tokens"])
                    put(item)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the request
                metrics.generations.labels("error").inc()
                put(_Failed(e))
            finally:
                metrics.generation_seconds.observe(time.monotonic() - t0)
                put(_END)

        try:
            done = loop.run_in_executor(self._gen_pool, work)
        except BaseException:
            self.gen_slots.release()
            raise
        done.add_done_callback(lambda _: self.gen_slots.release())
        try:
            while (item := await items.get()) is not _END:
                if isinstance(item, _Failed):
                    e = item.exc
                    if isinstance(e, SoftKNNError | ServiceError):
                        raise e
                    log.error("generation failed", exc_info=e, extra={"request_id": request_id})
                    raise InferenceFailed(f"generation failed ({type(e).__name__}); "
                                          "see the server log for this request id") from e
                yield item
        finally:
            cancel.set()  # a consumer that stopped early: the thread ends at its next token

    async def answer(self, ge: GenEngine, params: GenParams, prompt: str | None, messages: list[dict] | None,
                     *, request_id: str | None = None) -> GenAnswer:
        """`generate` to the end: the GenAnswer."""
        answer = None
        stream = self.generate(ge, params, prompt, messages, request_id=request_id)
        try:
            async for item in stream:
                answer = item
        finally:
            await stream.aclose()
        assert isinstance(answer, GenAnswer)
        return answer
