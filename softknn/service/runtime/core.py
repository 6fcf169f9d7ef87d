"""What the app serves: the model (loaded once), the current Engine (model + bundle), the batcher.

`Runtime` is one KB served. This module holds its core (start, open, reload, install, close, the
engine serving now, admission and the requests through the batcher); its generation
(`runtime.generation`, softknn.service.runtime.generation.Generation) and KB writes (`runtime.writes`,
softknn.service.runtime.writes.Writes) are objects it makes with their dependencies named, and what
the app's KBs share is softknn.service.runtime.shared.

`start` runs once, from the lifespan, in the background: model and bundle (checksums verified) in a
thread, then a warm-up pass; only then is the runtime ready. `reload` opens another bundle the same way, off the
hot path, and swaps the engine reference in one assignment: requests admitted before it keep the
engine they were pinned to (softknn.service.batching), requests after it get the new one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from softknn.common.errors import BundleError, InputTooLarge, SoftKNNError
from softknn.generate.engine import GenEngine
from softknn.generate.model import Generator
from softknn.index_builder.documents import BuilderDocuments
from softknn.infer.engine import Engine, InferParams
from softknn.infer.results import InferResult
from softknn.model.encoder import Encoder
from softknn.model.runtime import apply_threads, open_encoder
from softknn.params import Settings
from softknn.retrieval.rerank import Reranker
from softknn.service.errors import Conflict, InferenceFailed, NotReady, ServiceError
from softknn.service.metrics import Metrics
from softknn.service.runtime.generation import Generation
from softknn.service.runtime.shared import PlainEmbed, Shared, token_counter
from softknn.service.runtime.writes import Writes
from softknn.storage.bundle import load_bundle
from softknn.storage.remote import Location, is_remote, localize, source_of
from softknn.storage.writes import (
    KBStore,
    has_pending_writes,
    recover_swap,
    renamed,
    version_name,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("softknn.service")

WARMUP_TEXT = "softknn warm-up: how are the ferries today?"
# Requests with at most this many characters are tokenized for admission on the event loop itself
# (one call into the Rust tokenizer, cheaper than a thread hop); longer ones in a thread, so one big
# body never stalls the loop.
INLINE_ADMIT_CHARS = 2048


class Runtime:
    """One KB served: its engine, version, reloads, write store and generation. `kb` is its name
    (requests' `kb`, the metrics' label); `bundle` what it opens at start (default settings.bundle);
    `shared` what it shares with the app's other KBs (made here when not given)."""

    def __init__(self, settings: Settings, metrics: Metrics, *, encoder: Encoder | None = None, shard_backend=None,
                 generator: Generator | None = None, cluster=None, kb: str = "default",
                 bundle: Location | None = None, shared: Shared | None = None):
        self.settings = settings
        self.kb = kb
        self.bundle_path = bundle if bundle is not None else (settings.bundle if shared is None else None)
        self.shared = shared if shared is not None else Shared(settings, metrics, generator)
        self.shard_backend = shard_backend  # where a sharded bundle's shards run (None: in this process)
        # a Ray Serve replica's link to the deployment (softknn.service.ray.coordinator.ReplicaLink): what to serve
        # comes from it, and a reload runs through it on every replica; None: this process decides
        self.cluster = cluster
        self._retired: list = []  # bundles swapped out, closed once requests pinned to them are done
        self.metrics = metrics
        metrics.ready.labels(kb).set(0)
        self.encoder = encoder
        self.engine: Engine | None = None
        self.status = "starting"  # starting → ready | no_bundle | failed
        self.error: str | None = None
        # called with the reason when start() fails (`softknn serve` prints it and exits); None: stay up, 503
        self.on_failed_start: Callable[[str], None] | None = None
        self._counter: Tokenizer | None = None  # token_counter(encoder), once the model is loaded
        self.model_created = 0  # when the model was loaded (Unix seconds; /v1/models)
        self._reranker: Reranker | None = None  # /v1/rerank over the bundle serving now (Runtime.rerank)
        self._reload_lock = asyncio.Lock()  # reloads, KB writes and compactions: one at a time
        self.batcher = self.shared.batcher
        sh = self.shared
        self.generation = Generation(settings, metrics, slots=sh.gen_slots, pool=sh.gen_pool,
                                     generators=sh.generators, ready=self.current)
        self.writes = Writes(settings, metrics, kb=kb, pool=sh.write_pool, lock=self._reload_lock,
                             model=lambda: self.model, ready=self.current, swap=self.install)

    @property
    def model(self) -> Encoder:
        """The loaded model (_load_model sets it before any bundle is opened or request admitted)."""
        if self.encoder is None:
            raise NotReady("the model is still loading", headers={"Retry-After": "1"})
        return self.encoder

    @property
    def counter(self) -> Tokenizer:
        """The admission tokenizer (token_counter), set with the model."""
        if self._counter is None:
            raise NotReady("the model is still loading", headers={"Retry-After": "1"})
        return self._counter

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Model, bundle, warm-up; then ready. The lifespan runs it in the background. Never raises."""
        try:
            await asyncio.to_thread(self._load_model)
            if self.cluster is not None:
                await self.cluster.start(self)
                return
            if self.bundle_path is None:
                self.status, self.error = "no_bundle", ("no bundle configured (--bundle, SOFTKNN_BUNDLE); "
                                                        "POST /v1/admin/reload one")
                log.warning(self.error)
                return
            engine = await self.open(self.bundle_path)
            self.install(engine, await self.generation.open(engine))
        except Exception as e:
            self.status, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("startup failed: %s", self.error, exc_info=not isinstance(e, SoftKNNError))
            if self.on_failed_start is not None:
                self.on_failed_start(self.error)

    def share_model(self, other: Runtime) -> None:
        """Serve with `other`'s loaded model (one encoder for every KB of an app; call before start)."""
        self.encoder, self._counter, self.model_created = other.model, other.counter, other.model_created

    def _load_model(self) -> None:
        if self._counter is not None:  # shared from another KB (share_model): loaded once per app
            return
        t0 = time.perf_counter()
        threads = apply_threads(self.settings, serving=True)
        if self.encoder is None:
            self.encoder = open_encoder(self.settings, threads)
        self._counter = token_counter(self.encoder)
        self.model_created = int(time.time())
        self.metrics.set_model(self.encoder.info)
        log.info("model loaded", extra={"model": self.encoder.info.name, "device": str(self.encoder.device),
                                        "torch_threads": threads,
                                        "runtime": self.encoder.info.runtime, "precision": self.encoder.info.precision,
                                        "runtime_requested": self.encoder.info.requested,
                                        "runtime_fallback": self.encoder.info.fallback,
                                        "seconds": round(time.perf_counter() - t0, 2)})

    async def open(self, path: Location) -> Engine:
        """Verify and load a bundle for the loaded model (in a thread; a URI fetched first into the
        node-local cache, softknn.storage.remote.localize), then one warm-up pass.

        The warm-up goes through the batcher like any request, ahead of the queue: every forward
        pass of this process runs on the batcher's worker threads (one by default: two passes
        would fight for the same cores unless model.threads is 1 and batching.workers says so).
        """
        t0 = time.perf_counter()
        engine = await asyncio.to_thread(self._load_engine, path)
        tokens = len(self.counter.encode(WARMUP_TEXT).ids)
        try:
            await self.batcher.run(engine, [WARMUP_TEXT], [InferParams()], [tokens], [InferParams().k],
                                   timeout=max(60.0, self.settings.batching.request_timeout_s), request_id="warm-up",
                                   internal=True)
        except ServiceError:  # shutting down, deadline: not the bundle's fault
            raise
        except Exception as e:
            raise BundleError(f"{path}: warm-up pass failed: {type(e).__name__}: {e}", field="bundle") from e
        log.info("bundle opened", extra={"kb": self.kb, "bundle": str(path), "version_id": engine.bundle.version,
                                         "chunks": len(engine.bundle), "seconds": round(time.perf_counter() - t0, 2)})
        return engine

    def _load_engine(self, location: Location) -> Engine:
        try:
            path = localize(location)
            recover_swap(path)
            if has_pending_writes(path):  # acknowledged writes in its log: serve them (replayed), never the base alone
                store = KBStore(path, self.model, documents=BuilderDocuments(), use_gpu=self.settings.use_gpu_index)
                engine = Engine(self.model, store.bundle)
                self.writes.stores[engine] = store
                return engine
            bundle = load_bundle(path, expected_fingerprint=self.model.info.fingerprint,
                                 use_gpu=self.settings.use_gpu_index, shard_backend=self.shard_backend)
            seq = int((bundle.manifest.raw.get("writes") or {}).get("seq", 0))
            engine = Engine(self.model, renamed(bundle, version_name(bundle.version, seq)) if seq else bundle)
            engine.retriever.warm_filters()  # at open, not on the first filtered request
            source = str(location) if is_remote(location) else source_of(path)  # a cache folder named directly too
            if source is not None:
                self.writes.sources[engine] = source
            return engine
        except SoftKNNError:
            raise
        except Exception as e:  # a bundle that verifies but does not load is still the bundle's fault
            raise BundleError(f"{location}: cannot be loaded: {type(e).__name__}: {e}", field="bundle") from e

    def install(self, engine: Engine, generation: tuple[GenEngine | None, str] | None = None) -> None:
        """Serve `engine` from now on, and `generation` with it (Generation.open's answer; None: the
        generation stays as it is, a KB write's new version)."""
        if generation is not None:  # before the engine: a request that sees the new engine sees it
            self.generation.install(generation)
        self.engine = engine  # the atomic swap: one reference assignment
        self.status, self.error = "ready", None
        self.metrics.set_bundle(self.kb, engine.bundle.summary(), engine.encoder.info.name)
        self.metrics.ready.labels(self.kb).set(1)

    def close(self) -> None:
        """At shutdown, after the batcher: release what the bundle holds outside this process (a
        sharded bundle's Ray shard actors; a plain bundle holds nothing to release)."""
        self.shared.gen_pool.shutdown(wait=False, cancel_futures=True)  # running generations end with the process
        self.shared.write_pool.shutdown(wait=True)  # a write in progress finishes (its client may still get the answer)
        self.writes.close()
        if self.cluster is not None:
            self.cluster.stop()
        for bundle in [*self._retired, *([self.engine.bundle] if self.engine is not None else [])]:
            self._close_bundle(bundle)
        self._retired = []

    @staticmethod
    def _close_bundle(bundle) -> None:
        close = getattr(bundle, "close", None)
        if close is not None:
            close()

    def _retire(self, bundle) -> None:
        """Close a swapped-out bundle (its shard actors, if it owns any) once every request admitted
        before the swap is done with it: after the request timeout."""
        if getattr(bundle, "close", None) is None:
            return
        self._retired.append(bundle)

        def close() -> None:
            if bundle in self._retired:
                self._retired.remove(bundle)
                self._close_bundle(bundle)

        asyncio.get_running_loop().call_later(self.settings.batching.request_timeout_s + 1, close)

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.engine is not None

    def current(self) -> Engine:
        engine = self.engine
        if engine is None or self.status != "ready":
            msg = {"starting": "the model and bundle are still loading"}.get(self.status, self.error or self.status)
            raise NotReady(msg, headers={"Retry-After": "1"} if self.status == "starting" else None)
        return engine

    # --- requests -----------------------------------------------------------------------------
    def token_limit(self) -> int:
        model_max = self.model.max_seq_length
        return min(self.settings.limits.max_tokens or model_max, model_max)

    def admit(self, texts: list[str], truncate: bool, *, field: str = "inputs[{i}]",
              hint: str = "send truncate=true to cut it") -> tuple[list[str], list[int], list[int]]:
        """Token-limit check before queueing (one bad input never reaches a shared batch).

        Returns the texts (cut where the service's own token limit is below the model's and
        `truncate` allows it), each text's token count after cutting, and which texts were cut.
        A refusal names the input as `field` formatted with its index i, and says `hint`.
        """
        limit, model_max = self.token_limit(), self.model.max_seq_length
        out, tokens, cut = list(texts), [], []
        for i, enc in enumerate(self.counter.encode_batch(texts)):
            n = len(enc.ids)
            if n > limit:
                if not truncate:
                    where = field.format(i=i)
                    raise InputTooLarge(f"{where} has {n} tokens, more than the limit {limit}; {hint}", field=where)
                if limit < model_max:  # the engine cuts at the model's limit by itself
                    content = [j for j, special in enumerate(enc.special_tokens_mask) if not special]
                    keep = content[: max(1, limit - (n - len(content)))]
                    out[i] = texts[i][: enc.offsets[keep[-1]][1]]
                    cut.append(i)
            tokens.append(min(n, limit))
        return out, tokens, cut

    async def _admit(self, texts: list[str], truncate: bool, field: str, hint: str):
        if sum(map(len, texts)) <= INLINE_ADMIT_CHARS:  # a few µs of Rust: cheaper than a thread hop
            return self.admit(texts, truncate, field=field, hint=hint)
        return await asyncio.to_thread(self.admit, texts, truncate, field=field, hint=hint)

    async def _run(self, engine: Engine, texts: list[str], params: Sequence[InferParams | PlainEmbed],
                   tokens: list[int], slots: list[int], start: float, request_id: str | None) -> list:
        """Queue admitted texts on the batcher and wait, within the request's deadline from `start`."""
        timeout = self.settings.batching.request_timeout_s - (time.monotonic() - start)
        try:
            return await self.batcher.run(engine, texts, params, tokens, slots, timeout=timeout,
                                          request_id=request_id)
        except (SoftKNNError, ServiceError):
            raise
        except Exception as e:  # not the client's fault and not a refusal: a bug, answered as one
            log.error("inference failed", exc_info=e)
            raise InferenceFailed(f"inference failed ({type(e).__name__}); "
                                  "see the server log for this request id") from e

    async def embed(self, texts: list[str], *, truncate: bool, request_id: str | None = None,
                    field: str = "input[{i}]", hint: str = "send truncate=true to cut it") -> tuple[Engine, list[np.ndarray], list[int]]:
        """The plain model's embeddings through the batcher (admitted as /v1/infer's inputs are):
        (the engine that answered, one (D,) float32 vector per text, each text's token count)."""
        start = time.monotonic()
        engine = self.current()
        texts, tokens, _ = await self._admit(texts, truncate, field, hint)
        params = [PlainEmbed(truncate)] * len(texts)
        results = await self._run(engine, texts, params, tokens, [1] * len(texts), start, request_id)
        return engine, results, tokens

    async def rerank(self, query: str, texts: list[str], params: InferParams, *, truncate: bool, raw: bool,
                     request_id: str | None = None) -> tuple[Engine, np.ndarray]:
        """The rerank score of each text for `query` (softknn.retrieval.rerank): the plain embeddings of the
        query and the texts in one batcher job, then the scores against the KB in a thread."""
        start = time.monotonic()
        engine = self.current()
        p = engine.resolve([params])[0]
        hint = "send truncate=true to cut it"
        (query,), q_tokens, _ = await self._admit([query], truncate, "query", hint)
        texts, tokens, _ = await self._admit(texts, truncate, "texts[{i}]", hint)
        all_texts = [query, *texts]
        emb = await self._run(engine, all_texts, [PlainEmbed(truncate)] * len(all_texts), q_tokens + tokens,
                              [1] * len(all_texts), start, request_id)
        rr = self._reranker
        if rr is None or rr.retriever is not engine.retriever:
            rr = self._reranker = Reranker(engine.retriever)  # the KB's lexical statistics, counted once per bundle
        s = await asyncio.to_thread(rr.score, emb[0], np.stack(emb[1:]), query, texts, p, raw=raw)
        return engine, s

    async def infer(self, texts: list[str], params: list[InferParams], *, truncate: bool, cut: Sequence[int] = (),
                    request_id: str | None = None, field: str = "inputs[{i}]",
                    hint: str = "send truncate=true to cut it") -> tuple[Engine, list[InferResult]]:
        """Admit, queue, wait: (the engine that answered, one result per text).

        `cut` lists inputs already cut before (to the character limit); their results, like those
        of inputs cut here, report diagnostics.truncated = true.
        """
        start = time.monotonic()
        engine = self.current()  # pinned: a reload after this line does not change this request's bundle
        resolved = engine.resolve(params)  # refused here (422), never inside a shared micro-batch
        texts, tokens, cut_here = await self._admit(texts, truncate, field, hint)
        n = len(engine.bundle)
        slots = [p.search_size(n) for p in resolved]
        results = await self._run(engine, texts, resolved, tokens, slots, start, request_id)
        for i in {*cut, *cut_here}:
            results[i] = results[i].truncated()
        for r in results:
            self.metrics.memory_share.observe(r.diagnostics.memory_share)
        return engine, results

    async def reload(self, path: Location) -> tuple[str | None, Engine]:
        """Open `path` off the hot path, then swap; (previous version id, new engine)."""
        if self.encoder is None or self._counter is None:
            raise NotReady("the model is still loading", headers={"Retry-After": "1"})
        if self._reload_lock.locked():
            raise Conflict("another reload, KB write or compaction is in progress", field="bundle")
        if self.cluster is not None:  # every replica of the deployment swaps, or none does
            async with self._reload_lock:
                try:
                    previous, engine = await self.cluster.reload(self, path)
                except Exception:
                    self.metrics.reloads.labels(self.kb, "refused").inc()
                    raise
                self.metrics.reloads.labels(self.kb, "ok").inc()
            log.info("bundle swapped on every replica", extra={"kb": self.kb, "previous_version": previous,
                                                               "version_id": engine.bundle.version})
            return previous, engine
        async with self._reload_lock:
            try:
                engine = await self.open(path)
                generation = await self.generation.open(engine)
            except BundleError as e:
                self.metrics.reloads.labels(self.kb, "refused").inc()
                e.field = e.field or "bundle"  # the request field that named it
                raise
            except Exception:
                self.metrics.reloads.labels(self.kb, "refused").inc()
                raise
            old = self.engine
            previous = old.bundle.version if old is not None else None
            self.install(engine, generation)
            if old is not None:
                self._retire(old.bundle)
            self.metrics.reloads.labels(self.kb, "ok").inc()
        log.info("bundle swapped", extra={"kb": self.kb, "previous_version": previous, "version_id": engine.bundle.version})
        return previous, engine

