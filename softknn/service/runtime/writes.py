"""A KB's writes (Runtime's part, softknn.service.runtime.core): put, delete and read documents, and
compaction, through the KB's write store (softknn.storage.writes.KBStore; the builder's document
reading and encoding, softknn.index_builder.documents). Each write is durable before it returns and
swaps its new version in like a reload; writes run on the app's one low-priority write thread."""

from __future__ import annotations

import asyncio
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from softknn.common.errors import DocumentNotFound, SoftKNNError, WriteRefused
from softknn.generate.engine import GenEngine
from softknn.index_builder.documents import BuilderDocuments
from softknn.infer.engine import Engine
from softknn.model.encoder import Encoder
from softknn.params import Settings
from softknn.service.metrics import Metrics
from softknn.storage.writes import KBStore, WriteResult, writable

log = logging.getLogger("softknn.service")


class RuntimeWrites:
    """Runtime's KB-write methods (a mixin of softknn.service.runtime.core.Runtime, which sets these)."""

    settings: Settings
    metrics: Metrics
    kb: str
    encoder: Encoder | None
    _reload_lock: asyncio.Lock
    _write_pool: ThreadPoolExecutor
    _stores: weakref.WeakKeyDictionary[Engine, KBStore]
    _sources: weakref.WeakKeyDictionary[Engine, str]
    _compaction: asyncio.Task | None
    _gen: GenEngine | None
    _gen_reason: str

    if TYPE_CHECKING:
        @property
        def model(self) -> Encoder: ...

        def current(self) -> Engine: ...

        def _install(self, engine: Engine, generation: tuple[GenEngine | None, str] = ...) -> None: ...

    # --- KB writes (softknn.storage.writes) -----------------------------------------------------
    def _store(self, engine: Engine) -> KBStore:
        """The KBStore of the KB `engine` serves (opened on the first write, over the loaded bundle)."""
        store = self._stores.get(engine)
        if store is None:
            if engine.bundle.manifest.sharded:
                writable(engine.bundle.manifest)  # refuses, saying why
            uri = self._sources.get(engine)
            if uri is not None:  # a write into the cache would be lost with it, and never reach the store
                raise WriteRefused(f"this KB is a cached copy of {uri}: writes are not supported on a bundle "
                                   "served from object storage; build the new version and reload it")
            store = KBStore(engine.bundle.path, self.encoder, documents=BuilderDocuments(),
                            use_gpu=self.settings.use_gpu_index, base=engine.bundle)  # type: ignore[arg-type]  # not sharded: a Bundle
        return store

    def document(self, doc_id: str) -> tuple[Engine, dict]:
        """(the engine read, one document of its KB)."""
        engine = self.current()
        store = self._stores.get(engine)
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
        self.current()
        async with self._reload_lock:
            engine = self.current()  # after the wait: the version every earlier write left
            loop = asyncio.get_running_loop()
            store = await loop.run_in_executor(self._write_pool, self._store, engine)
            if op == "put":
                result = await loop.run_in_executor(self._write_pool, store.put, doc_id, record or {})
            else:
                result = await loop.run_in_executor(self._write_pool, store.delete, doc_id)
            new = self._install_version(store, engine)
        self.metrics.kb_writes.labels(self.kb, op).inc()
        limit = self.settings.writes.compact_after
        if limit and store.pending_writes >= limit and (self._compaction is None or self._compaction.done()):
            self._compaction = asyncio.create_task(self._compact_quietly())
        return new, result

    def _install_version(self, store: KBStore, engine: Engine) -> Engine:
        new = Engine(self.model, store.bundle)
        self._stores[new] = store
        self._install(new, (self._gen, self._gen_reason))  # writes refuse generator bundles: nothing to change
        return new

    async def compact(self) -> tuple[Engine, dict]:
        """Fold the KB's logged writes into a new base bundle (softknn.storage.writes.KBStore.compact)."""
        self.current()
        async with self._reload_lock:
            engine = self.current()
            loop = asyncio.get_running_loop()
            store = await loop.run_in_executor(self._write_pool, self._store, engine)
            result = await loop.run_in_executor(self._write_pool, store.compact)
            new = self._install_version(store, engine) if result["writes_folded"] else engine
        log.info("KB compacted", extra={"kb": self.kb, "version_id": new.bundle.version, "writes_folded": result["writes_folded"],
                                        "recalibrated": result["recalibrated"]})
        return new, result

    async def _compact_quietly(self) -> None:
        try:
            await self.compact()
        except Exception as e:  # the log keeps every write: the next threshold crossing tries again
            log.error("background compaction failed: %s", e, exc_info=not isinstance(e, SoftKNNError))
