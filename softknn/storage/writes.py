"""KB writes: put and delete documents of a bundle without a rebuild (docs/design.md, "KB writes").

A bundle directory is the *base*, as the builder (or a compaction) wrote it. Writes are document
operations in a write-ahead log, `DIR/writes/wal.log`, each fsynced before it is acknowledged, and
applied to an in-memory *version* of the KB: a softknn.storage.layout.Bundle whose rows are the KB's
chunks in KB order (the base's documents in bundle order; a put of an existing id keeps its place,
a new id goes to the end), with the FAISS index, BM25 index and (labelled KB) calibration of that
KB, computed by the builder's own functions, so a version answers as a fresh build of its KB does.

A version's memory (K/V, hidden states) and token spans are the base's memory-mapped arrays plus
each written chunk's own arrays, read through SegmentedRows: a write copies no memory. `compact`
writes the current version as a new base (the builder's finalize: checksummed, renamed into
place) and empties the log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import faiss
import numpy as np

from softknn.common.errors import BundleError, DocumentNotFound, KBFormatError, WriteRefused
from softknn.retrieval.calibration import calibrate_loo
from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec, build_index, choose_index
from softknn.retrieval.lexical import Analyzer, LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import CANDIDATES
from softknn.retrieval.search import InferParams
from softknn.storage.bundle import finalize, load_bundle
from softknn.storage.layout import Bundle, allocated_memmap, fsync_dir, read_manifest, save_array
from softknn.storage.manifest import Manifest
from softknn.storage.memory_stores import HIDDEN_DTYPES, HiddenStore, KVStore, RecomputeStore

log = logging.getLogger(__name__)

WRITES_DIR = "writes"
WAL = f"{WRITES_DIR}/wal.log"
# a labelled KB is recalibrated (leave-one-out, softknn.retrieval.calibration) at every version up to this
# many chunks (0.13 s at 297 chunks on one core); above it at compaction only, marked stale between
RECALIBRATE_MAX_CHUNKS = 5000
_HEADER = struct.Struct(">I32s")  # payload length, sha256 of the payload


# --- the write-ahead log ------------------------------------------------------------------------
@dataclass(frozen=True)
class LogRecord:
    seq: int
    op: str  # put | delete
    doc_id: str
    doc: dict | None = None  # put: {"text", "label", "metadata"}

    def payload(self) -> bytes:
        return json.dumps({"seq": self.seq, "op": self.op, "doc_id": self.doc_id, "doc": self.doc},
                          sort_keys=True, ensure_ascii=False).encode()


def encode_record(rec: LogRecord) -> bytes:
    body = rec.payload()
    return _HEADER.pack(len(body), hashlib.sha256(body).digest()) + body


def read_log(path: Path) -> tuple[list[LogRecord], int, int]:
    """(records, bytes of whole records, bytes of a torn tail). A record cut short or failing its
    checksum is accepted as torn only at the end of the log (a write that died before its
    acknowledgement); anywhere else the log is corrupt: BundleError."""
    data = path.read_bytes() if path.is_file() else b""
    out: list[LogRecord] = []
    pos = 0
    while pos < len(data):
        bad = None
        if len(data) - pos < _HEADER.size:
            bad = "a header cut short"
        else:
            n, digest = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size : pos + _HEADER.size + n]
            if len(body) < n:
                bad = "a record cut short"
            elif hashlib.sha256(body).digest() != digest:
                bad = "a checksum mismatch"
        if bad is not None:
            if _later_record(data, pos + 1):
                raise BundleError(f"{path}: {bad} at byte {pos}, before other records (corrupt write log)")
            return out, pos, len(data) - pos
        try:
            d = json.loads(body)
            rec = LogRecord(int(d["seq"]), str(d["op"]), str(d["doc_id"]), d.get("doc"))
        except (ValueError, KeyError, TypeError) as e:
            raise BundleError(f"{path}: record at byte {pos} checksums but does not parse: {e}") from e
        if rec.op not in ("put", "delete") or (out and rec.seq != out[-1].seq + 1):
            raise BundleError(f"{path}: record at byte {pos}: op {rec.op!r}, seq {rec.seq} out of order")
        out.append(rec)
        pos += _HEADER.size + n
    return out, pos, 0


def _later_record(data: bytes, start: int) -> bool:
    """Whether a whole, checksummed record starts anywhere at or after `start` (a torn tail has none)."""
    for pos in range(start, len(data) - _HEADER.size + 1):
        n, digest = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + n
        if n and end <= len(data) and hashlib.sha256(data[pos + _HEADER.size : end]).digest() == digest:
            return True
    return False


class WriteLog:
    """Append-only, fsynced: `append` returns once the record is on disk."""

    def __init__(self, bundle_dir: Path):
        self.path = Path(bundle_dir) / WAL
        self.records, good, torn = read_log(self.path)
        self.torn = torn
        if torn:  # never acknowledged: cut it off so the next record follows the last whole one
            log.warning("%s: dropping a torn tail of %d bytes (a write that never completed)", self.path, torn)
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self._f: BinaryIO | None = None

    def append(self, rec: LogRecord) -> None:
        if self._f is None:
            new = not self.path.parent.is_dir()
            self.path.parent.mkdir(exist_ok=True)
            self._f = open(self.path, "ab")  # noqa: SIM115 - held open for the store's life
            if new:
                fsync_dir(self.path.parent.parent)
            fsync_dir(self.path.parent)
        f = self._f
        f.write(encode_record(rec))
        f.flush()
        os.fsync(f.fileno())
        self.records.append(rec)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None




# --- rows spread over the base's arrays and the written chunks' own ------------------------------
class SegmentedRows:
    """An array read by rows (`a[i:j]`, `a[int array]`) whose rows are the base's (memory-mapped)
    followed by appended segments; append-only, so an older version's rows never change."""

    def __init__(self, base: np.ndarray, segments: tuple[np.ndarray, ...] = ()):
        self.base = base
        self.segments = segments
        lens = [len(base)] + [len(s) for s in segments]
        self._starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)  # first row of each part
        self.rows = len(base) + sum(len(s) for s in segments)
        self.shape = (self.rows, *base.shape[1:])
        self.dtype = base.dtype
        self.ndim = base.ndim

    def __len__(self) -> int:
        return self.rows

    def appended(self, seg: np.ndarray) -> SegmentedRows:
        assert seg.shape[1:] == self.shape[1:], (seg.shape, self.shape)
        return SegmentedRows(self.base, (*self.segments, np.ascontiguousarray(seg, dtype=self.dtype)))

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.rows)
            if step == 1 and stop <= len(self.base):
                return self.base[start:stop]
            key = np.arange(start, stop, step)
        idx = np.asarray(key, dtype=np.int64)
        if idx.ndim == 0:
            return self[idx[None]][0]
        if not self.segments or (len(idx) and idx.max() < len(self.base)):
            return self.base[idx]
        out = np.empty((len(idx), *self.shape[1:]), dtype=self.dtype)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        for s in np.unique(which):
            sel = which == s
            src = self.base if s == 0 else self.segments[s - 1]
            out[sel] = src[idx[sel] - self._starts[s]]
        return out


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of a version: its record (chunks.jsonl), its row in the embedding rows, its first
    token row and token count in the memory rows, its analysed terms (None without a lexical index)."""

    record: dict
    emb: int
    tok: int
    count: int
    terms: tuple[str, ...] | None


@dataclass(frozen=True)
class State:
    """What a version is made of: documents in KB order, and the rows their chunks point into."""

    docs: dict[str, tuple[ChunkRef, ...]]  # insertion order = KB order; never mutated once built
    emb: SegmentedRows
    mem: dict[str, SegmentedRows]  # "keys"/"values" (kv), "hidden", nothing (recompute)
    spans: SegmentedRows
    written: dict[str, dict] = field(default_factory=dict)  # doc_id -> the record it was written with


@dataclass(frozen=True)
class WriteResult:
    op: str
    doc_id: str
    seq: int
    version: str
    chunks: int  # the document's chunks now (0 after a delete)
    created: bool  # put: the id was new; delete: False


def writable(m: Manifest) -> None:
    """Refuse what writes do not support yet, with why (WriteRefused: 409 over HTTP)."""
    if m.sharded:
        raise WriteRefused("writes are not supported on sharded bundles yet (built with --shards, served with "
                           "--ray): rebuild the KB with --shards 1 to take writes, or rebuild the sharded bundle")
    if m.generator is not None:
        raise WriteRefused("writes are not supported on bundles with generator memory yet: rebuild the KB")
    if m.memory == "hidden-int8":
        raise WriteRefused("writes are not supported on memory 'hidden-int8' (its per-channel scale depends on "
                           "every chunk): build with memory hidden (the default), hidden-fp16 or kv to take writes")


def version_name(base_version: str, seq: int) -> str:
    """bundle_version of the KB after write `seq`: the base's id, then `+w<seq>` (seq only grows)."""
    return base_version if seq == 0 else f"{base_version}+w{seq}"


def version_seq(version: str) -> int:
    """The write seq of a bundle_version (0 for a base that has taken no write)."""
    return int(version.rsplit("+w", 1)[1]) if "+w" in version else 0


class DocumentBuilder(Protocol):
    """What a write asks of the builder, passed in (softknn.index_builder.documents.BuilderDocuments),
    so that the storage layer imports no app: a document record read by the builder's own rules, and
    its chunks encoded as a build of the bundle encodes them."""

    def document(self, record: object, doc_id: str, where: str) -> Any:
        """The document of `record` (its .text, .label, .metadata), or KBFormatError naming `where`."""
        ...

    def encode(self, doc: Any, encoder: Any, manifest: Manifest) -> tuple[list[Any], list[dict[str, np.ndarray]]]:
        """(doc's chunks, each with .text and .record(); per batch of them the builder's arrays:
        emb, counts, spans and the memory rows), chunked and encoded by `manifest`'s build settings."""
        ...


class KBStore:
    """A bundle that takes writes: `bundle` is the current version (swap it into an Engine per
    write), `put`/`delete` log then apply, `document` reads one, `compact` folds the log into a new base.

    Writes are serialised by one lock; `bundle` is replaced in one assignment, so a reader holds one
    version throughout. The same class runs in the service and behind `softknn add/remove`."""

    def __init__(self, path: Path, encoder, *, documents: DocumentBuilder, use_gpu: bool = False,
                 verify: bool = True, base: Bundle | None = None):
        """`documents`: the builder's reading and encoding of a document; `base`: the bundle at `path`,
        already loaded (and verified) by the caller."""
        self.path = Path(path)
        self.encoder = encoder
        self.documents = documents
        self.use_gpu = use_gpu
        self.lock = threading.RLock()
        recover_swap(self.path)
        self._open(verify, base)

    # --- opening -------------------------------------------------------------------------------
    def _open(self, verify: bool, base: Bundle | None = None) -> None:
        if base is None:
            base = load_bundle(self.path, expected_fingerprint=self.encoder.info.fingerprint, verify=verify,
                               use_gpu=self.use_gpu)
        m = base.manifest
        writable(m)
        self.base = base
        self.base_raw = m.raw
        self.base_vid = base.version.split("+w")[0]  # the manifest's id (a caller may pass the base renamed)
        self.base_seq = int((m.raw.get("writes") or {}).get("seq", 0))
        self.lexical_spec = LexicalSpec.from_manifest(m.lexical.settings) if m.lexical is not None else None
        self.analyzer = Analyzer(self.lexical_spec) if self.lexical_spec is not None else None
        # recalibrate as a default build would: unless the base is a labelled KB built without calibration
        calibrated = bool((m.raw.get("calibration") or {}).get("retrieval_defaults"))
        self.calibrate = calibrated or not m.labels
        self.state = self._base_state(base)
        self.log = WriteLog(self.path)
        pending = [r for r in self.log.records if r.seq > self.base_seq]
        if self.log.records and self.log.records[0].seq > self.base_seq + 1:
            raise BundleError(f"{self.path / WAL}: starts at write {self.log.records[0].seq}, the base holds "
                              f"writes up to {self.base_seq}: records are missing")
        self.seq = self.base_seq
        if pending:
            self._replay(pending)
            self.bundle = self._version(self.state, self.seq)
        else:  # the base as loaded, named as the version it is (its seq kept, so versions only move forward)
            self.bundle = renamed(base, version_name(self.base_vid, self.seq))

    def _base_state(self, b: Bundle) -> State:
        kv = b.kv
        start, count = np.asarray(kv.start), np.asarray(kv.count)  # type: ignore[attr-defined]  # every store has them
        docs: dict[str, list[ChunkRef]] = {}
        for i, c in enumerate(b.chunks):
            terms = tuple(self.analyzer.terms(c["text"])) if self.analyzer is not None else None
            docs.setdefault(c["doc_id"], []).append(ChunkRef(c, i, int(start[i]), int(count[i]), terms))
        mem: dict[str, SegmentedRows] = {}
        if isinstance(kv, KVStore):
            mem = {"keys": SegmentedRows(kv.keys), "values": SegmentedRows(kv.values)}
        elif isinstance(kv, HiddenStore):
            mem = {"hidden": SegmentedRows(kv.hidden)}
        return State({d: tuple(v) for d, v in docs.items()}, SegmentedRows(b.index.xb), mem,
                     SegmentedRows(np.asarray(b.token_spans)))

    def _replay(self, records: list[LogRecord]) -> None:
        """The records after the base, applied: only the documents they leave written are encoded."""
        final: dict[str, dict | None] = {}
        order = dict(self.state.docs)  # KB order: replayed in sequence, chunks filled in below
        for r in records:
            if r.op == "put":
                order.setdefault(r.doc_id, ())
                final[r.doc_id] = r.doc
            else:
                order.pop(r.doc_id, None)
                final[r.doc_id] = None
        state = State(order, self.state.emb, self.state.mem, self.state.spans, dict(self.state.written))
        for doc_id, doc in final.items():
            if doc is None:
                state.written.pop(doc_id, None)
                continue
            state = self._with_document(state, self.documents.document(doc, doc_id, f"{WAL} record for {doc_id!r}"), doc)
        self.state, self.seq = state, records[-1].seq
        log.info("replayed %d writes (up to seq %d) over %s", len(records), self.seq, self.path)

    # --- writes --------------------------------------------------------------------------------
    def put(self, doc_id: str, record: dict) -> WriteResult:
        """Add or replace document `doc_id` (`record`: {"text", "label"?, "metadata"?}); returns once durable."""
        doc_id = check_doc_id(doc_id)
        if not isinstance(record, dict):
            raise KBFormatError("a document is a JSON object: {\"text\": ..., \"label\": ..., \"metadata\": {...}}")
        doc = self.documents.document(record, doc_id, f"document {doc_id!r}")
        stored = {"text": doc.text, "label": doc.label, "metadata": doc.metadata}
        refs = self._encode(doc)  # before the lock: a bad document costs no other write anything
        with self.lock:
            created = doc_id not in self.state.docs
            state = self._attach(self.state, doc, refs, stored)
            self._commit(LogRecord(self.seq + 1, "put", doc_id, stored), state)
            return WriteResult("put", doc_id, self.seq, self.bundle.version, len(refs[0]), created)

    def delete(self, doc_id: str) -> WriteResult:
        with self.lock:
            if doc_id not in self.state.docs:
                raise DocumentNotFound(f"no document {doc_id!r} in the KB (version {self.bundle.version})",
                                       field="doc_id")
            docs = {d: v for d, v in self.state.docs.items() if d != doc_id}
            written = {d: v for d, v in self.state.written.items() if d != doc_id}
            state = State(docs, self.state.emb, self.state.mem, self.state.spans, written)
            self._commit(LogRecord(self.seq + 1, "delete", doc_id), state)
            return WriteResult("delete", doc_id, self.seq, self.bundle.version, 0, False)

    def _commit(self, rec: LogRecord, state: State) -> None:
        """Log (fsync) first, then the version: a write is visible only once it is durable."""
        bundle = self._version(state, rec.seq)  # a failure here leaves nothing logged
        self.log.append(rec)
        self.state, self.seq, self.bundle = state, rec.seq, bundle

    def document(self, doc_id: str) -> dict:
        """One document as the current version holds it: its record and its chunks."""
        bundle, state = self.bundle, self.state
        refs = state.docs.get(doc_id)
        if refs is None:
            raise DocumentNotFound(f"no document {doc_id!r} in the KB (version {bundle.version})", field="doc_id")
        first = refs[0].record
        written = state.written.get(doc_id)
        return {"doc_id": doc_id, "label": first.get("label"), "metadata": first.get("metadata") or {},
                "text": written["text"] if written else (first["text"] if len(refs) == 1 else None),
                "written": written is not None,
                "chunks": [{"chunk_id": r.record["chunk_id"], "start": r.record["start"], "end": r.record["end"],
                            "text": r.record["text"]} for r in refs],
                "bundle_version": bundle.version}

    @property
    def pending_writes(self) -> int:
        """Writes in the log that the base does not hold yet."""
        return self.seq - self.base_seq

    # --- a document's chunks, encoded by the builder's own code (self.documents) ------------------
    def _encode(self, doc):
        return self.documents.encode(doc, self.encoder, self.base.manifest)

    def _attach(self, state: State, doc, encoded, stored: dict) -> State:
        """`state` with `doc`'s encoded chunks appended to the rows and the document in KB order."""
        chunks, arrays = encoded
        emb, spans, mem = state.emb, state.spans, dict(state.mem)
        refs: list[ChunkRef] = []
        for part in arrays:
            e0, t0 = len(emb), len(spans)
            emb = emb.appended(part["emb"].astype(np.float32))
            spans = spans.appended(part["spans"])
            if "keys" in mem:
                mem["keys"], mem["values"] = mem["keys"].appended(part["keys"]), mem["values"].appended(part["values"])
            elif "hidden" in mem:
                mem["hidden"] = mem["hidden"].appended(part["hidden"].astype(HIDDEN_DTYPES[self.base.manifest.memory]))
            firsts = np.concatenate([[0], np.cumsum(part["counts"])[:-1]])
            for j, (n, f) in enumerate(zip(part["counts"].tolist(), firsts.tolist(), strict=True)):
                c = chunks[len(refs)]
                terms = tuple(self.analyzer.terms(c.text)) if self.analyzer is not None else None
                refs.append(ChunkRef(c.record(), e0 + j, t0 + f, n, terms))
        docs = dict(state.docs)
        docs[doc.doc_id] = tuple(refs)  # an existing id keeps its place; a new one goes to the end
        return State(docs, emb, mem, spans, {**state.written, doc.doc_id: stored})

    def _with_document(self, state: State, doc, stored: dict) -> State:
        return self._attach(state, doc, self._encode(doc), stored)

    # --- a version: the bundle a fresh build of the KB would be ----------------------------------
    def _version(self, state: State, seq: int) -> Bundle:
        refs = [r for rs in state.docs.values() for r in rs]
        if not refs:
            raise WriteRefused("this write would leave the KB without a chunk; a bundle needs at least one")
        emb_rows = np.fromiter((r.emb for r in refs), dtype=np.int64, count=len(refs))
        xb = np.ascontiguousarray(state.emb[emb_rows], dtype=np.float32)
        start = np.fromiter((r.tok for r in refs), dtype=np.int64, count=len(refs))
        count = np.fromiter((r.count for r in refs), dtype=np.int64, count=len(refs))
        chunks = [r.record for r in refs]
        texts = [c["text"] for c in chunks]
        n, d = xb.shape
        spec = self._index_spec(n, d)
        index = ChunkIndex(build_index(xb, spec), xb, spec, use_gpu=self.use_gpu)
        lexical = None
        lex_entry = None
        if self.lexical_spec is not None:
            lexical = LexicalIndex.from_terms([list(r.terms or ()) for r in refs], self.lexical_spec)
            lex_entry = {"settings": self.lexical_spec.to_manifest(), "vocabulary": len(lexical.vocab),
                         "postings": lexical.n_postings}
        m = self.base.manifest
        if m.memory == "kv":
            kv = KVStore(state.mem["keys"], state.mem["values"], start, count)  # type: ignore[arg-type]  # row-readable arrays
        elif m.memory == "recompute":
            kv = RecomputeStore(texts, start, count, m.model.num_heads, m.model.head_dim)  # type: ignore[assignment]
        else:
            kv = HiddenStore(state.mem["hidden"], None, start, count, m.model.num_heads, m.model.head_dim)  # type: ignore[arg-type,assignment]
        labels: dict[str, int] = {}
        for c in chunks:
            if c.get("label") is not None:
                labels[c["label"]] = labels.get(c["label"], 0) + 1
        raw = {k: v for k, v in self.base_raw.items() if k not in ("version_id",)}
        raw.update(counts={"docs": len(state.docs), "chunks": n, "tokens": int(count.sum()),
                           "labelled_chunks": sum(labels.values())},
                   labels=sorted(labels), label_counts=dict(sorted(labels.items())),
                   index={"kind": spec.kind, "params": spec.params, "reason": spec.reason},
                   writes={"seq": seq, "base_version": self.base_vid, "pending": seq - self.base_seq})
        if lex_entry is not None:
            raw["lexical"] = lex_entry
        if seq != self.base_seq:
            raw["calibration"] = self._calibration(xb, [c.get("label") for c in chunks], texts, lexical, labels, seq)
        raw["version_id"] = version_name(self.base_vid, seq)
        manifest = Manifest.of(raw, f"{self.path} at write {seq}")
        return Bundle(path=self.path, manifest=manifest, index=index, kv=kv, chunks=chunks,
                      token_spans=state.spans, labels=sorted(labels), lexical=lexical,  # type: ignore[arg-type]
                      _by_id={c["chunk_id"]: i for i, c in enumerate(chunks)})

    def _index_spec(self, n: int, d: int) -> IndexSpec:
        """The index a fresh build would choose: `auto` re-resolved for n chunks, a requested kind kept."""
        rec = self.base.manifest.index
        if rec.reason == "requested":
            return choose_index(n, d, rec.kind, dict(rec.params))
        return choose_index(n, d, "auto")

    def _calibration(self, xb, labels, texts, lexical, counts: dict, seq: int) -> dict:
        base = self.base_raw.get("calibration") or {}
        if not counts and base.get("source") == "pseudo-queries":
            # an unlabelled KB keeps the λ its build chose (it needs the encoder again: `softknn build`)
            return dict(base)
        if not counts or not self.calibrate:
            return {"abstain_threshold": None}
        if len(labels) > RECALIBRATE_MAX_CHUNKS:
            cal = dict(self.base_raw.get("calibration") or {})
            cal["stale"] = {"since_version": self.base_vid, "writes": seq - self.base_seq,
                            "note": f"over {RECALIBRATE_MAX_CHUNKS} chunks: recalibrated at the next compaction"}
            return cal
        return calibrate_loo(xb, labels, texts, lexical, k=InferParams().k, candidates=CANDIDATES)

    # --- compaction ----------------------------------------------------------------------------
    def compact(self) -> dict:
        """Write the current version as a new base (no re-encoding), rename it over the directory,
        start an empty log. Returns {"manifest", "recalibrated", "writes_folded"}."""
        with self.lock:
            folded = self.pending_writes
            if folded == 0:
                return {"manifest": self.base_raw, "recalibrated": False, "writes_folded": 0}
            bundle, state = self.bundle, self.state
            tmp = self.path.parent / f".{self.path.name}.tmp-compact-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                manifest, recalibrated = self._write_base(tmp, bundle, state)
                self.log.close()
                result = finalize(tmp, self.path, manifest, force=True)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self._open(verify=False)  # just written and checksummed by finalize
            log.info("compacted %s: %d writes folded, version %s%s", self.path, folded, result["version_id"],
                     ", labelled KB recalibrated" if recalibrated else "")
            return {"manifest": result, "recalibrated": recalibrated, "writes_folded": folded}

    def _write_base(self, tmp: Path, bundle: Bundle, state: State) -> tuple[dict, bool]:
        refs = [r for rs in state.docs.values() for r in rs]
        counts = np.asarray([r.count for r in refs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        tok_rows = np.concatenate([np.arange(r.tok, r.tok + r.count) for r in refs]) if refs else np.zeros(0, np.int64)
        xb = np.ascontiguousarray(bundle.index.xb, dtype=np.float32)
        save_array(tmp / "embeddings.npy", xb)
        index = bundle.index.index if not bundle.index.on_gpu else build_index(xb, bundle.index.spec)
        (tmp / "index.faiss").write_bytes(faiss.serialize_index(index).tobytes())
        names = {"keys": "kv_keys.npy", "values": "kv_values.npy", "hidden": "mem_hidden.npy"}
        for key, rows in state.mem.items():
            out = allocated_memmap(tmp / names[key], rows.dtype, (len(tok_rows), *rows.shape[1:]))
            for i in range(0, len(tok_rows), 65_536):
                out[i : i + 65_536] = rows[tok_rows[i : i + 65_536]]
            out.flush()
            del out
        save_array(tmp / "token_spans.npy", np.asarray(state.spans[tok_rows], dtype=np.int64))
        save_array(tmp / "chunk_tokens.npy", np.stack([starts, counts], axis=1))
        with open(tmp / "chunks.jsonl", "w", encoding="utf-8") as f:
            for r in refs:
                f.write(json.dumps(r.record, sort_keys=True, ensure_ascii=False) + "\n")
        if bundle.lexical is not None:
            bundle.lexical.save(tmp)
        raw = {k: v for k, v in bundle.manifest.raw.items() if k not in ("files", "version_id", "created_at")}
        recalibrated = bool(raw.get("labels")) and self.calibrate
        if recalibrated:  # what the build does for a labelled KB (per write it may have been skipped: stale)
            raw["calibration"] = calibrate_loo(xb, [c.get("label") for c in bundle.chunks],
                                               [c["text"] for c in bundle.chunks], bundle.lexical,
                                               k=InferParams().k, candidates=CANDIDATES)
        raw["writes"] = {"seq": self.seq}
        raw["build"] = {**(raw.get("build") or {}), "compacted_from": self.base_vid, "writes_folded": self.pending_writes}
        return raw, recalibrated

    def close(self) -> None:
        self.log.close()


def check_doc_id(doc_id: str) -> str:
    if not isinstance(doc_id, str) or not doc_id.strip() or len(doc_id) > 512:
        raise KBFormatError(f"document id {doc_id[:40]!r}: must be 1–512 characters and not blank", field="doc_id")
    return doc_id


def renamed(bundle: Bundle, version: str) -> Bundle:
    """`bundle` answering as version `version` (a base with writes folded in keeps its seq in its name)."""
    if version == bundle.version:
        return bundle
    return replace(bundle, manifest=Manifest.of({**bundle.manifest.raw, "version_id": version}, bundle.path))


def has_pending_writes(path: Path) -> bool:
    """Whether DIR/writes/wal.log holds a write the base does not (then the bundle must open as a KBStore)."""
    wal = Path(path) / WAL
    if not wal.is_file() or wal.stat().st_size == 0:
        return False
    seq = int((read_manifest(path).get("writes") or {}).get("seq", 0))
    recs, _, _ = read_log(wal)
    return bool(recs) and recs[-1].seq > seq


def recover_swap(path: Path) -> None:
    """A compaction killed between finalize's two renames leaves no `path` and the old bundle (with
    its full log) moved aside: move it back. Half-written compactions are removed."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not path.exists():
        old = sorted(parent.glob(f".{path.name}.old-*"))
        if len(old) == 1 and (old[0] / "manifest.json").is_file():
            log.warning("%s: restoring %s (a compaction stopped mid-swap)", path, old[0])
            os.replace(old[0], path)
    if path.exists():
        for stale in parent.glob(f".{path.name}.tmp-compact-*"):
            shutil.rmtree(stale, ignore_errors=True)


def verify_log(path: Path) -> dict:
    """Check DIR/writes/wal.log (if any): every record checksummed and in order, a torn tail only
    at the end. Returns {"records", "torn_bytes", "first_seq", "last_seq"}; BundleError if corrupt."""
    recs, _, torn = read_log(Path(path) / WAL)
    return {"records": len(recs), "torn_bytes": torn, "first_seq": recs[0].seq if recs else None,
            "last_seq": recs[-1].seq if recs else None}
