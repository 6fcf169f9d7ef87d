"""A KB's generation (`Generation`, an object of its Runtime, softknn.service.runtime.core): the GenEngine
of the bundle serving now, opened beside it, and the generate/answer streaming.

When the bundle's manifest has a generator record, its causal LM is loaded (once per name, kept
across reloads: softknn.generate.serving) and a GenEngine over the same retriever and encoder is
installed with it. At most
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
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor

from softknn.common.errors import SoftKNNError
from softknn.generate.engine import GenAnswer, GenEngine, GenParams
from softknn.generate.model import Generator, Step
from softknn.generate.serving import gen_engine_for
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


class Generation:
    """One KB's generation, with its dependencies given: the settings, the metrics, what the app's KBs
    share (`slots`, the generation threads `pool`, the loaded `generators`) and `ready`, the KB's engine
    serving now (503 until there is one). Holds the GenEngine serving now, or why there is none."""

    def __init__(self, settings: Settings, metrics: Metrics, *, slots: GenSlots, pool: ThreadPoolExecutor,
                 generators: dict[str, Generator], ready: Callable[[], Engine]):
        self.settings, self.metrics = settings, metrics
        self.slots, self.pool, self.generators, self.ready = slots, pool, generators, ready
        self.engine: GenEngine | None = None
        self.reason = "the model and bundle are still loading"
        self.created = 0  # when the served generator was installed (Unix seconds; /v1/models)

    async def open(self, engine: Engine) -> tuple[GenEngine | None, str]:
        """The GenEngine for `engine`'s bundle, or (None, why not). Never raises: a generator that does
        not load leaves /v1/infer serving and the generation routes answering generator_unavailable."""
        rec = engine.bundle.manifest.generator
        if rec is None:
            return None, (f"bundle {engine.bundle.version} was built without a generator "
                          "(softknn build KB --out DIR --generator smollm2-135m-instruct)")
        try:
            ge = await asyncio.to_thread(self._load, engine)
        except Exception as e:
            reason = f"generator {self.settings.generator.name or rec.name} did not load: {type(e).__name__}: {e}"
            log.error(reason, exc_info=not isinstance(e, SoftKNNError))
            return None, reason
        return ge, ""

    def _load(self, engine: Engine) -> GenEngine:
        t0 = time.perf_counter()
        ge = gen_engine_for(self.settings, engine.retriever, engine.encoder, self.generators)
        if self.settings.generator.runtime == "graph":  # the decode graph built and run once before /readyz
            ge.warm_up()
        log.info("generator loaded", extra={"generator": ge.generator.info.name, "layers": len(ge.layers),
                                            "memory": ge.store.kind, "seconds": round(time.perf_counter() - t0, 2)})
        return ge

    def install(self, generation: tuple[GenEngine | None, str]) -> None:
        """Serve `generation` (open's answer) from now on."""
        self.engine, self.reason = generation
        if self.engine is not None:
            self.created = int(time.time())
        info = self.engine.generator.info if self.engine is not None else None
        self.metrics.generator.info({"name": info.name, "fingerprint": info.fingerprint} if info else {})

    @property
    def served(self) -> GenEngine | None:
        """The GenEngine serving now, or None (no generator, or it did not load)."""
        return self.engine

    def current(self) -> GenEngine:
        """The GenEngine serving now; 503 until ready, 409 generator_unavailable without one."""
        self.ready()
        ge = self.engine
        if ge is None:
            raise GeneratorUnavailable(f"no generator is served: {self.reason}")
        return ge

    # --- generation ---------------------------------------------------------------------------
    async def generate(self, ge: GenEngine, params: GenParams, prompt: str | None, messages: list[dict] | None,
                       *, request_id: str | None = None) -> AsyncGenerator[Step | GenAnswer, None]:
        """Wait for a slot (429 past the queue), then run `ge.stream` on a generation thread: yields
        each Step as it is chosen, then the GenAnswer. Closing this iterator early (a client gone)
        cancels the generation at its next token; the slot frees when its thread ends."""
        params = params.validate()  # 422 here, before a slot is taken
        start = time.monotonic()
        await self.slots.acquire(self.settings.batching.request_timeout_s)
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
            done = loop.run_in_executor(self.pool, work)
        except BaseException:
            self.slots.release()
            raise
        done.add_done_callback(lambda _: self.slots.release())
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
