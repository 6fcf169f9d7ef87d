"""A KB's writes (`Writes`, an object of its Runtime, softknn.service.runtime.core): put, delete and read
documents, and compaction, through the KB's write store (softknn.storage.writes.KBStore; the builder's document
reading and encoding, softknn.index_builder.documents). Each write is durable before it returns and
swaps its new version in like a reload; writes run on the app's one low-priority write thread."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from softknn.common.errors import DocumentNotFound, SoftKNNError, WriteRefused
from softknn.index_builder.documents import BuilderDocuments
from softknn.infer.engine import Engine
from softknn.model.encoder import Encoder
from softknn.params import Settings
from softknn.service.metrics import Metrics
from softknn.storage.writes import KBStore, WriteResult, writable

log = logging.getLogger("softknn.service")


class Writes:
    """One KB's writes, with their dependencies given: the settings, the metrics, the KB's name, the
    app's one write thread (`pool`), the KB's lock that reloads take too, and from its Runtime:
    `model` (the loaded encoder), `ready` (the engine serving now) and `swap` (serve a new engine
    of the same KB: a KB with writes has no generator, so its generation stays as it is)."""

    def __init__(self, settings: Settings, metrics: Metrics, *, kb: str, pool: ThreadPoolExecutor, lock: asyncio.Lock,
                 model: Callable[[], Encoder], ready: Callable[[], Engine], swap: Callable[[Engine], None]):
        self.settings, self.metrics, self.kb = settings, metrics, kb
        self.pool, self.lock, self.model, self.ready, self.swap = pool, lock, model, ready, swap
        self.stores: weakref.WeakKeyDictionary[Engine, KBStore] = weakref.WeakKeyDictionary()  # engines serving a KB with writes
        # engines serving a cached copy of a bundle in object storage: the URI (no writes into a cache)
        self.sources: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()
        self._compaction: asyncio.Task | None = None

    def close(self) -> None:
        for store in list(self.stores.values()):
            store.close()

    # --- KB writes (softknn.storage.writes) -----------------------------------------------------
    def _store(self, engine: Engine) -> KBStore:
        """The KBStore of the KB `engine` serves (opened on the first write, over the loaded bundle)."""
        store = self.stores.get(engine)
        if store is None:
            if engine.bundle.manifest.sharded:
                writable(engine.bundle.manifest)  # refuses, saying why
            uri = self.sources.get(engine)
            if uri is not None:  # a write into the cache would be lost with it, and never reach the store
                raise WriteRefused(f"this KB is a cached copy of {uri}: writes are not supported on a bundle "
                                   "served from object storage; build the new version and reload it")
            store = KBStore(engine.bundle.path, self.model(), documents=BuilderDocuments(),
                            use_gpu=self.settings.use_gpu_index, base=engine.bundle)  # type: ignore[arg-type]  # not sharded: a Bundle
        return store

    def document(self, doc_id: str) -> tuple[Engine, dict]:
        """(the engine read, one document of its KB)."""
        engine = self.ready()
        store = self.stores.get(engine)
        if store is not None and store.bundle is engine.bundle:
            return engine, store.document(doc_id)
        rows = [c for c in engine.bundle.chunks if c["doc_id"] == doc_id]
        if not rows:
            raise DocumentNotFound(f"no document {doc_id!r} in the KB (version {engine.bundle.version})", field="doc_id")
        return engine, {"doc_id": doc_id, "label": rows[0].get("label"), "metadata": rows[0].get("metadata") or {},
                        "text": rows[0]["text"] if len(rows) == 1 else None, "written": False,
                        "chunks": [{k: c[k] for k in ("chunk_id", "start", "end", "text")} for c in rows]}

    async def write(self, op: str, doc_id: str, record: dict | None = None) -> tuple[Engine, WriteResult]:
        """Put or delete one document: durable (logged, fsynced) before it returns; then the new version
        serves, swapped in like a reload (requests already admitted finish on the version they started with)."""
        self.ready()
        async with self.lock:
            engine = self.ready()  # after the wait: the version every earlier write left
            loop = asyncio.get_running_loop()
            store = await loop.run_in_executor(self.pool, self._store, engine)
            if op == "put":
                result = await loop.run_in_executor(self.pool, store.put, doc_id, record or {})
            else:
                result = await loop.run_in_executor(self.pool, store.delete, doc_id)
            new = self._install_version(store, engine)
        self.metrics.kb_writes.labels(self.kb, op).inc()
        limit = self.settings.writes.compact_after
        if limit and store.pending_writes >= limit and (self._compaction is None or self._compaction.done()):
            self._compaction = asyncio.create_task(self._compact_quietly())
        return new, result

    def _install_version(self, store: KBStore, engine: Engine) -> Engine:
        new = Engine(self.model(), store.bundle)
        self.stores[new] = store
        self.swap(new)
        return new

    async def compact(self) -> tuple[Engine, dict]:
        """Fold the KB's logged writes into a new base bundle (softknn.storage.writes.KBStore.compact)."""
        self.ready()
        async with self.lock:
            engine = self.ready()
            loop = asyncio.get_running_loop()
            store = await loop.run_in_executor(self.pool, self._store, engine)
            result = await loop.run_in_executor(self.pool, store.compact)
            new = self._install_version(store, engine) if result["writes_folded"] else engine
        log.info("KB compacted", extra={"kb": self.kb, "version_id": new.bundle.version, "writes_folded": result["writes_folded"],
                                        "recalibrated": result["recalibrated"]})
        return new, result

    async def _compact_quietly(self) -> None:
        try:
            await self.compact()
        except Exception as e:  # the log keeps every write: the next threshold crossing tries again
            log.error("background compaction failed: %s", e, exc_info=not isinstance(e, SoftKNNError))
