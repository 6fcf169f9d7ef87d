"""Sharded bundles: one KB in N shards, served in one process or by one Ray actor per shard.

On disk (written by `softknn build KB --out DIR --shards N`, softknn.index_builder.pipeline):

    DIR/manifest.json          the one-index manifest (model, layer, index spec, counts, labels,
                               calibration over the whole KB, lexical settings) plus `shards`: per
                               shard its directory, its global row range [lo, hi) and token range,
                               and its own version_id; `files`: size + sha256 of every file of
                               every shard (shard manifests included); one version_id over all
    DIR/shard-0000/ ...        an ordinary bundle (softknn.storage.bundle) of rows lo..hi−1 of the global
                               chunk order: its own FAISS index, embeddings, memory (its token
                               rows of the manifest's representation), token spans,
                               chunks and BM25 index

Global chunk id = global row = shard's lo + local row, so the merge tie-break (score desc, id asc)
is the one-index order. The shard's BM25 index is the global index's columns lo..hi−1: every
per-(term, chunk) score was computed with the whole KB's N, avgdl and document frequencies, so
a shard's BM25 score of a chunk is bit-for-bit the one-index score (sliced, never recomputed).

Serving: `Shard` is all the per-shard work (dense top k, exact similarities, BM25 scores, the
memory gather of requested rows); it runs in-process or as a Ray actor (softknn.storage.ray_shards)
with the same code. `ShardedBundle` stands where a `Bundle` stands for the Engine: its `index`,
`lexical` and `kv` fan each call out to the shards and merge exactly:

- dense top k: each shard's exact (or index) top k, merged by (score desc, global id asc);
- hybrid and lexical retrieval (exact or not): each shard sends its own dense top, BM25 top m
  and those candidates' scores (`Shard.lexical_candidates`, O(m) numbers, not one per chunk); the
  global top lists, the normalisation's x_(1), x_(m) and the candidates' scores are exactly the
  one index's (each global top-m chunk is in its shard's top m), merged by
  `ShardedBundle.lexical_candidates`; when those candidates cannot decide the top k
  (softknn.retrieval.scoring.topk_candidates), the brute force over the KB takes the shards' score
  vectors: the exact similarities and BM25 scores concatenated in row order (as filters do);
- memory: of `kv`, each shard sends the token rows of the requested chunks as stored (unpadded), and
  they are placed in the padded batch by the one store's code (memory_stores.pad_memory); of
  `hidden`/`hidden-fp16`/`hidden-int8`, each shard holds its token rows of the stored states (int8:
  with the whole KB's per-channel scale, copied into every shard, so a row dequantises as in the
  one-index bundle) and sends the requested rows as stored; the serving process dequantises and
  projects them with its model, one GEMM over the rows in one-index order (the same K/V bit for
  bit); `recompute` runs here on the chunk texts this process holds. A serving process on the
  machine of a shard reads those rows from the shard's own files instead (`map_local`: only the very
  files the shard verified and mapped, same device, inode, size and mtime), the same bytes without
  an actor call; elsewhere, or when the files differ, it asks the shard.

The serving process keeps the KB's metadata memory-mapped from disk for the evidence: the chunks
(softknn.storage.chunks.MappedChunks: 24 B per chunk resident, a row decoded when read), the token
spans (np.load mmap_mode="r"); the chunk token ranges are two int64 per chunk in memory; the bulk (index, embeddings, K/V, BM25 postings scores) lives in the shards.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch

from softknn.common.errors import BundleError, ShardUnavailable  # noqa: F401 (re-exported)
from softknn.model.attention import MemoryBatch
from softknn.model.backends import MemoryStore, ShardBackend
from softknn.retrieval.chunk_index import IndexSpec
from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import best, candidates, top_m
from softknn.storage.chunks import ChunkTexts, MappedChunks
from softknn.storage.layout import (
    MANIFEST,
    bundle_summary,
    check_versions,
    load_npy,
    open_bundle,
    read_manifest,
    shard_own_files,
    verify_files,
)
from softknn.storage.manifest import Manifest
from softknn.storage.memory_stores import HIDDEN_DTYPES, HiddenStore, RecomputeStore, memory_kind, pad_memory
from softknn.storage.remote import fetch, is_remote, source_of


def host_id() -> str | None:
    """This machine's boot id (Linux; None elsewhere): equal in two processes exactly when they run
    on one machine since its last boot (in containers of one host too)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def _file_id(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def map_local(maps: dict | None) -> dict[str, np.ndarray] | None:
    """The arrays a shard described (`Shard.memory_maps`), mapped read-only by this process, when it
    runs on the shard's machine and opens the very files the shard mapped (same device, inode, size
    and mtime, checked on the open descriptor); else None, and the rows are read through the shard."""
    if not maps or maps.get("host") is None or maps["host"] != host_id():
        return None
    out: dict[str, np.ndarray] = {}
    for name, a in maps["arrays"].items():
        try:
            with open(a["path"], "rb") as f:
                if _file_id(os.fstat(f.fileno())) != list(a["file"]):
                    return None  # replaced since the shard opened it, or another machine's file
                out[name] = np.memmap(f, dtype=np.dtype(a["dtype"]), mode="r", offset=int(a["offset"]),
                                      shape=tuple(a["shape"]))
        except (OSError, ValueError):  # unreadable here, or an empty array (nothing to map)
            return None
    return out


# --- the per-shard work (in-process or inside a Ray actor) ------------------------------------------
class Shard:
    """One shard's index, embeddings, memory and BM25 scores; ids in and out are global rows.

    `version`: the shard's version_id in the sharded manifest it was opened for. A shard whose
    directory holds another version (rebuilt in place since) refuses to open, and so does one whose
    directory was replaced while it loaded: a shard never serves rows of a bundle other than the one
    the serving process merges them with. `run` answers with the version it holds, for the caller's
    own check (softknn.storage.ray_shards)."""

    def __init__(self, path: str | Path, lo: int, version: str | None = None, *, verify: bool = False,
                 use_gpu: bool = False):
        if is_remote(path):  # a shard of a bundle in object storage: its directory, fetched to this node
            path = fetch(str(path))
        path = Path(path)
        try:
            inode = os.stat(path).st_ino
        except OSError as e:
            raise BundleError(f"{path}: shard directory unreadable: {e}") from e
        if verify:  # its own files (the serving process checks the metadata it opens: replica_files)
            raw = read_manifest(path)
            m = Manifest.of(raw, path / MANIFEST)
            verify_files(path, m, shard_own_files(m.memory))
            check_versions(path, raw, m)
        self.bundle = open_bundle(path, use_gpu=use_gpu)
        self._maps = self._memory_files()  # before the check below: the files of the directory it checks
        if version is not None and self.bundle.version != version:
            raise BundleError(f"{path}: holds shard version {self.bundle.version}, but this shard was opened for "
                              f"{version} (the bundle was rebuilt in place); reload the service to serve it")
        if os.stat(path).st_ino != inode:
            raise BundleError(f"{path}: replaced while this shard was loading; reload the service")
        self.lo = int(lo)
        self.n = len(self.bundle)

    @property
    def version(self) -> str:
        return self.bundle.version

    def ping(self) -> str:
        return self.version

    def _memory_files(self) -> dict | None:
        kv = self.bundle.kv
        names = ("hidden",) if hasattr(kv, "hidden") else ("keys", "values") if hasattr(kv, "keys") else ()
        arrays = {}
        for name in names:
            a = getattr(kv, name)
            if not isinstance(a, np.memmap) or a.filename is None:
                return None  # in memory (a GPU or converted copy): only this process reads it
            arrays[name] = {"path": str(a.filename), "offset": int(a.offset), "dtype": a.dtype.str,
                            "shape": list(a.shape), "file": _file_id(os.stat(a.filename))}
        host = host_id()
        return {"host": host, "arrays": arrays} if arrays and host else None

    def memory_maps(self) -> dict | None:
        """Where this shard's stored memory rows lie (per array: file, offset, dtype, shape, and the
        file's device, inode, size and mtime as it was opened) and this machine's id, for a serving
        process on this machine to read them itself (`map_local`); None when they are not mapped
        from a file (a recompute store, or arrays held in memory)."""
        return self._maps

    def run(self, method: str, args: tuple) -> tuple[str, object]:
        """(the version this shard holds, `method(*args)`): one call of a remote caller."""
        return self.version, getattr(self, method)(*args)

    def search(self, xq: np.ndarray, k: int, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) (B, min(k, n)): this shard's top k, I global (−1 stays −1)."""
        D, I = self.bundle.index.search(xq, min(int(k), self.n), exact=exact)
        return D, np.where(I >= 0, I + self.lo, -1)

    def search_among(self, xq: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(D, I): this shard's top k among the global rows `rows` (all this shard's), I global."""
        D, I = self.bundle.index.search_among(xq, k, np.asarray(rows, dtype=np.int64) - self.lo)
        return D, np.where(I >= 0, I + self.lo, -1)

    def similarities(self, xq: np.ndarray) -> np.ndarray:
        """(B, n) float32 e_q·e_c over this shard's chunks (the exact path's scores)."""
        return self.bundle.index.similarities(xq).numpy()

    def rows_dot(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        return self.bundle.index.rows_dot(np.asarray(ids) - self.lo, q)

    def bm25(self, terms: list[str]) -> np.ndarray:
        """(n,) float32 BM25 of every chunk of this shard, with the whole KB's statistics."""
        return cast("LexicalIndex", self.bundle.lexical).scores(terms)  # bm25 is called on lexical bundles only

    def lexical_candidates(self, xq: np.ndarray, terms: list[list[str]], dsize: int, pools: list[int],
                           exact: bool) -> list[tuple]:
        """Per input, this shard's part of the hybrid and lexical candidates (softknn.retrieval.scoring),
        O(dsize + pool) numbers instead of a score per chunk: (D, I) its dense top dsize (by the
        index, or with `exact` by the brute force over its chunks, score desc then id asc), L and
        Lb its BM25 top pool ids and scores (the whole KB's statistics), and C, Cd, Cb its
        candidates I ∪ L (ascending) with their dense similarities (`exact`: the brute force's,
        else e_q·e_c of the stored rows) and BM25 scores. Ids global."""
        index, lex = self.bundle.index, cast("LexicalIndex", self.bundle.lexical)
        k = min(int(dsize), self.n)
        d_all = None
        if exact:
            d_all = index.similarities(xq).numpy()  # (B, n) as the one-index exact path scores
            local = np.arange(self.n)
            top = [best(row, local, k) for row in d_all]
            D, I = np.stack([t[0] for t in top]), np.stack([t[1] for t in top])
        else:
            D, I = index.search(xq, k)
        out = []
        for j, t in enumerate(terms):
            b = lex.scores(t)
            L = top_m(b, pools[j])
            C = candidates(I[j], L)
            Cd = d_all[j][C] if d_all is not None else index.rows_dot(C, xq[j])
            out.append((D[j], np.where(I[j] >= 0, I[j] + self.lo, -1), L + self.lo, b[L], C + self.lo, Cd, b[C]))
        return out

    def hidden_rows(self, rows: np.ndarray) -> np.ndarray:
        """(n, C) the stored hidden states of this shard's token rows `rows` (local), in their stored
        dtype (memory `hidden*`; the caller dequantises and projects them: softknn.storage.shards._HiddenRows)."""
        return np.asarray(self.bundle.kv.hidden[np.asarray(rows, dtype=np.int64)])  # type: ignore[attr-defined]  # a HiddenStore

    def memory_scale(self) -> np.ndarray | None:
        """hidden-int8's per-channel scale (C,) (the whole KB's: every shard holds the same), else None."""
        return getattr(self.bundle.kv, "scale", None)

    def kv_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """keys, values (n, nh, hs) of this shard's token rows `rows` (local), in their stored dtype
        (memory `kv`): only the tokens asked, unpadded; the caller pads them as one store would."""
        kv = self.bundle.kv
        rows = np.asarray(rows, dtype=np.int64)
        return np.asarray(kv.keys[rows]), np.asarray(kv.values[rows])  # type: ignore[attr-defined]  # a KVStore


# --- calling the shards: in-process, or Ray actors -----------------------------------------------
class LocalShards:
    """The shards in this process; `call` runs one method on each (sequentially: each uses every core)."""

    def __init__(self, shards: list[Shard]):
        self.shards = shards

    def call(self, method: str, args: list[tuple]) -> list:
        return [getattr(s, method)(*a) for s, a in zip(self.shards, args, strict=True)]

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        return [getattr(self.shards[s], method)(*a) for s, a in zip(shards, args, strict=True)]

    def health(self) -> list[str]:
        return []  # in this process: they answer as long as it does

    def close(self) -> None:
        self.shards = []


class _Index:
    """The KB's index as the Engine sees it (softknn.model.backends.ChunkSearch), over the shards."""

    def __init__(self, owner: ShardedBundle, spec):
        self.owner, self.spec = owner, spec
        self.ntotal = len(owner)

    def search(self, xq: np.ndarray, k: int, *, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The global top k: every shard's top k, merged by (score desc, global id asc)."""
        k = max(1, min(int(k), self.ntotal))
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        return self._merge(self.owner.call("search", [(xq, k, exact)] * self.owner.n_shards), k, len(xq))

    def search_among(self, xq: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The top k among `rows`: each shard holding some of them searches those, merged as `search`."""
        rows = np.asarray(rows, dtype=np.int64)
        k = max(1, min(int(k), len(rows)))
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        groups = self.owner.split(rows)
        todo = [s for s, pos in enumerate(groups) if len(pos)]
        return self._merge(self.owner.call_some("search_among", todo, [(xq, k, rows[groups[s]]) for s in todo]),
                           k, len(xq))

    @staticmethod
    def _merge(parts: list, k: int, B: int) -> tuple[np.ndarray, np.ndarray]:
        """The shards' (D, I) merged into the global top k by (score desc, global id asc)."""
        D = np.concatenate([p[0] for p in parts], axis=1)
        I = np.concatenate([p[1] for p in parts], axis=1)
        outD = np.full((B, k), -np.inf, dtype=np.float32)
        outI = np.full((B, k), -1, dtype=np.int64)
        for b in range(B):
            keep = I[b] >= 0
            order = np.lexsort((I[b][keep], -D[b][keep]))[:k]
            outD[b, : len(order)], outI[b, : len(order)] = D[b][keep][order], I[b][keep][order]
        return outD, outI

    def similarities(self, xq: np.ndarray) -> torch.Tensor:
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        parts = self.owner.call("similarities", [(xq,)] * self.owner.n_shards)
        return torch.from_numpy(np.concatenate(parts, axis=1))

    def rows_dot(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.zeros(len(ids), dtype=np.float32)
        groups = self.owner.split(ids)
        todo = [s for s, pos in enumerate(groups) if len(pos)]
        res = self.owner.call_some("rows_dot", todo, [(ids[groups[s]], q) for s in todo])
        for s, r in zip(todo, res, strict=True):
            out[groups[s]] = r
        return out


class _Lexical:
    """The KB's BM25 index as the Engine sees it: scores from the shards, matched words from the
    shards' postings (memory-mapped here), the analyzer of the manifest's settings."""

    def __init__(self, owner: ShardedBundle, parts: list):
        self.owner, self.parts = owner, parts
        self.analyzer = parts[0].analyzer
        self.spec = parts[0].spec
        self.n = len(owner)

    def __len__(self) -> int:
        return self.n

    def scores(self, terms: list[str]) -> np.ndarray:
        return np.concatenate(self.owner.call("bm25", [(terms,)] * self.owner.n_shards))

    def matched(self, terms: list[str], c: int) -> set[str]:
        s = self.owner.shard_of(c)
        return self.parts[s].matched(terms, c - self.owner.lo[s])

    def matched_rows(self, terms: list[str], rows: list[int]) -> list[set[str]]:
        out: list[set[str]] = [set() for _ in rows]
        by_shard: dict[int, list[int]] = {}
        for k, c in enumerate(rows):
            by_shard.setdefault(self.owner.shard_of(c), []).append(k)
        for s, ks in by_shard.items():
            for k, hit in zip(ks, self.parts[s].matched_rows(terms, [rows[k] - self.owner.lo[s] for k in ks]), strict=True):
                out[k] = hit
        return out


class _Spans:
    """token_spans over the shards' token ranges (global token row = shard's first + local row)."""

    def __init__(self, parts: list[np.ndarray], first: list[int]):
        self.parts, self.first = parts, first

    def __getitem__(self, sl: slice) -> np.ndarray:
        s = bisect.bisect_right(self.first, sl.start) - 1
        off = self.first[s]
        return self.parts[s][sl.start - off : sl.stop - off]


class _KV:
    """Stored K/V (memory `kv`) as the Engine sees it (softknn.model.backends.MemoryStore): `gather` pads
    the retrieved chunks' token rows as one store does (softknn.storage.memory_stores.pad_memory), the rows
    read from their shards (`rows`); `start`/`count` global."""

    def __init__(self, owner: ShardedBundle, start: np.ndarray, count: np.ndarray, nh: int, hs: int,
                 first: list[int], local: list[dict | None] | None = None):
        """first: each shard's first global token row (shard s holds token rows first[s] + its local rows);
        local: per shard its arrays mapped by this process (map_local), or None: read through the shard."""
        self.owner, self.start, self.count = owner, start, count
        self.num_heads, self.head_dim = nh, hs
        self.first = np.asarray(first, dtype=np.int64)
        self.local = list(local) if local is not None else [None] * len(first)

    def attach(self, encoder, layer: int) -> None:
        """Stored K/V need no model (the other memories are `_sharded_memory`'s HiddenStore / RecomputeStore)."""

    def rows(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) float32 of global token rows `rows`, in that order: one call per shard
        holding some, each sending only those rows in their stored dtype (a padded (nh, S, Lm, hs)
        float32 block per shard is several times the bytes through the object store)."""
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self.first, rows, side="right") - 1
        todo = [s for s in range(len(self.first)) if (which == s).any()]
        asked = [s for s in todo if self.local[s] is None]
        res = dict(zip(asked, self.owner.call_some("kv_rows", asked, [(rows[which == s] - self.first[s],)
                                                                     for s in asked]), strict=True)) if asked else {}
        shape = (len(rows), self.num_heads, self.head_dim)
        k, v = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
        for s in todo:
            if s in res:
                ks, vs = res[s]
            else:  # what Shard.kv_rows reads, from the same file
                mine, arr = rows[which == s] - self.first[s], self.local[s]
                ks, vs = np.asarray(arr["keys"][mine]), np.asarray(arr["values"][mine])  # type: ignore[index]
            k[which == s], v[which == s] = ks, vs  # to float32 as KVStore.rows converts
        return torch.from_numpy(k), torch.from_numpy(v)

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """The MemoryBatch one store's `gather` builds: S = max |R|, Lm = the longest chunk."""
        return pad_memory(ids, weights, self.start, self.count, self.num_heads, self.head_dim, device, self.rows)


class _HiddenRows:
    """The KB's stored hidden states (Ntok, C) as softknn.storage.memory_stores.HiddenStore reads them: an
    indexed read `h[rows]` (global token rows) fetches each row from its shard, stored dtype kept,
    in the order asked. The replica's HiddenStore then dequantises and projects them with its own
    model in one GEMM over the same rows in the same order as the one-index bundle's store: the
    same K/V, bit for bit."""

    ndim = 2

    def __init__(self, owner: ShardedBundle, first: list[int], ntok: int, width: int, dtype,
                 local: list[dict | None] | None = None):
        self.owner, self.first = owner, np.asarray(first, dtype=np.int64)
        self.shape, self.dtype = (ntok, width), np.dtype(dtype)
        self.local = list(local) if local is not None else [None] * len(first)  # as _KV's

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.shape[1]), dtype=self.dtype)
        which = np.searchsorted(self.first, rows, side="right") - 1
        todo = [s for s in range(len(self.first)) if (which == s).any()]
        asked = [s for s in todo if self.local[s] is None]
        res = dict(zip(asked, self.owner.call_some("hidden_rows", asked, [(rows[which == s] - self.first[s],)
                                                                         for s in asked]), strict=True)) if asked else {}
        for s in todo:
            # what Shard.hidden_rows reads, from the same file, when this process maps it
            out[which == s] = res[s] if s in res else self.local[s]["hidden"][rows[which == s] - self.first[s]]  # type: ignore[index]
        return out


def _sharded_memory(b: ShardedBundle, start: np.ndarray, count: np.ndarray, first: list[int], ntok: int,
                    local: list[dict | None] | None = None):
    """The memory store of a sharded bundle, by the manifest's `memory`: stored K/V gathered on the
    shards (`_KV`); hidden states read from the shards and projected here, where the model is
    (HiddenStore over `_HiddenRows`, with the KB's one int8 scale, which every shard holds a copy of);
    `recompute` here, from the chunk texts this process holds."""
    m = b.manifest
    kind = memory_kind(m.memory)
    nh, hs = m.model.num_heads, m.model.head_dim
    if kind == "kv":
        return _KV(b, start, count, nh, hs, first, local)
    if kind == "recompute":
        return RecomputeStore(cast("list[str]", ChunkTexts(b.chunks)), start, count, nh, hs)  # read on access
    scale = None
    if kind == "hidden-int8":
        scales = b.call("memory_scale", [()] * b.n_shards)
        if any(x is None or not np.array_equal(x, scales[0]) for x in scales):
            raise BundleError(f"{b.path}: its shards hold different int8 scales (not the shards of one build)")
        scale = np.asarray(scales[0], dtype=np.float32)
    rows = _HiddenRows(b, first, ntok, nh * hs, HIDDEN_DTYPES[kind], local)
    return HiddenStore(cast("np.ndarray", rows), scale, start, count, nh, hs)


@dataclass
class ShardedBundle:
    """A sharded bundle where the Engine expects a `Bundle` (same attributes), over `backend`'s shards."""

    path: Path
    manifest: Manifest
    backend: ShardBackend  # LocalShards or softknn.storage.ray_shards.RayShards (softknn.model.backends)
    chunks: MappedChunks  # memory-mapped from the shards' chunks.jsonl: a row decoded when read
    lo: list[int]  # first global row of each shard
    labels: list[str] = field(default_factory=list)
    index: _Index | None = None
    lexical: _Lexical | None = None
    kv: MemoryStore | None = None
    token_spans: _Spans | None = None

    n_shards = property(lambda self: len(self.lo))
    version = property(lambda self: self.manifest.version_id)
    memory_layer = property(lambda self: self.manifest.memory_layer)

    def __len__(self) -> int:
        return len(self.chunks)

    def row_of(self, chunk_id: str) -> int | None:
        return self.chunks.row_of(chunk_id)

    def shard_of(self, row: int) -> int:
        return bisect.bisect_right(self.lo, int(row)) - 1

    def split(self, ids: np.ndarray) -> list[np.ndarray]:
        """Per shard, the positions in `ids` of its rows."""
        which = np.searchsorted(np.asarray(self.lo), ids, side="right") - 1
        return [np.flatnonzero(which == s) for s in range(self.n_shards)]

    def call(self, method: str, args: list[tuple]) -> list:
        return self.backend.call(method, args)

    def lexical_candidates(self, xq: np.ndarray, terms: list[list[str]], dsize: int, pools: list[int],
                           exact: bool) -> list[tuple]:
        """Per input, the hybrid and lexical candidates over the whole KB from one call per shard
        (Shard.lexical_candidates: each sends its own top lists, never a score per chunk):
        (dense_D, dense_I, cand, d_cand, b_cand, b_top1, b_topm), the arguments of
        softknn.retrieval.scoring.topk_candidates. Exact: the global dense top dsize and BM25 top pool are
        among the shards' own top lists (each chunk of them is in its shard's), so their values,
        b_(1) and b_(m) are the one index's; every candidate is one of some shard's, which sent its
        dense similarity and BM25 score."""
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        k = max(1, min(int(dsize), len(self)))
        parts = self.call("lexical_candidates", [(xq, terms, k, pools, exact)] * self.n_shards)
        out = []
        for j, pool in enumerate(pools):
            per = [p[j] for p in parts]
            dense_D, dense_I = _Index._merge([(p[0][None], p[1][None]) for p in per], k, 1)
            Lb = np.concatenate([p[3] for p in per])
            L = np.concatenate([p[2] for p in per])
            m = max(1, min(int(pool), len(Lb)))
            top = np.lexsort((L, -Lb))[:m]  # the global BM25 top m (score desc, id asc)
            C = np.concatenate([p[4] for p in per])  # each shard's ascending, shards in row order: ascending
            cand = np.union1d(dense_I[0][dense_I[0] >= 0], L[top])
            at = np.searchsorted(C, cand)
            d_cand = np.concatenate([np.asarray(p[5]) for p in per])[at]
            b_cand = np.concatenate([p[6] for p in per])[at]
            out.append((dense_D[0], dense_I[0], cand, d_cand, b_cand, float(Lb[top].max()), float(Lb[top].min())))
        return out

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        return self.backend.call_some(method, shards, args)

    def summary(self) -> dict:
        return bundle_summary(self.path, self.manifest)

    def health(self) -> list[str]:
        """Why a shard cannot answer now (one line per shard, naming it); [] when every shard answers."""
        return self.backend.health()

    def close(self) -> None:
        self.backend.close()


def shard_specs(location: Path | str, manifest: Manifest) -> list[tuple[str, int, str]]:
    """Per shard of a sharded manifest: (its directory, its first global row, its version_id), the
    arguments of `Shard`. Of a bundle in object storage (a URI, or a local copy of one: source_of),
    a shard's directory is its URI, which the shard fetches to its own node."""
    base = str(location) if is_remote(location) else source_of(Path(location))
    if base is not None:
        return [(f"{base.rstrip('/')}/{sh.dir}", sh.rows[0], sh.version_id) for sh in manifest.shards or ()]
    return [(str(Path(location) / sh.dir), sh.rows[0], sh.version_id) for sh in manifest.shards or ()]


def load_sharded(path: Path, manifest: Manifest, *, backend_factory=None, use_gpu: bool = False,
                 verify: bool = True) -> ShardedBundle:
    """A sharded bundle's metadata (verified by load_bundle: replica_files), and its shards opened by
    `backend_factory(specs, version)` (specs: [(shard dir, lo, shard version_id)]; default: in this
    process, each checking its own files when `verify`): the one place a ShardBackend is chosen."""
    assert manifest.shards is not None, f"{path}: a sharded manifest lists its shards"  # load time, not a hot path

    path = Path(path)
    starts, counts, spans, first, lo, lex_parts, files, held = [], [], [], [], [], [], [], []
    tok = row = 0
    for sh in manifest.shards:
        d = path / sh.dir
        sub = Manifest.of(read_manifest(d), d / "manifest.json")
        if (row, row + sub.counts.chunks) != sh.rows:
            raise BundleError(f"{d}: rows {list(sh.rows)} in the manifest, the shard holds {sub.counts.chunks} chunks "
                              f"from row {row}")
        if sub.version_id != sh.version_id:
            raise BundleError(f"{d / 'manifest.json'}: version {sub.version_id}, the bundle's manifest says {sh.version_id}")
        files.append(d / "chunks.jsonl")
        held.append(sub.counts.chunks)
        row += sub.counts.chunks
        ct = np.asarray(load_npy(d / "chunk_tokens.npy"))
        starts.append(ct[:, 0] + tok)
        counts.append(ct[:, 1])
        spans.append(load_npy(d / "token_spans.npy"))
        first.append(tok)
        lo.append(sh.rows[0])
        tok += sub.counts.tokens
        if manifest.lexical is not None:
            lex_parts.append(LexicalIndex.load(d, LexicalSpec.from_manifest(manifest.lexical.settings)))
    chunks = MappedChunks(files)  # every line decoded once here (a bad one is a BundleError naming its file)
    for f, s_lines, s_rows in zip(files, chunks.shard_lengths(), held, strict=True):
        if s_lines != s_rows:
            raise BundleError(f"{f}: {s_lines} lines, its shard's manifest counts {s_rows} chunks")
    if len(chunks) != manifest.counts.chunks:
        raise BundleError(f"{path}: the shards hold {len(chunks)} chunks, the manifest {manifest.counts.chunks}")
    specs = shard_specs(path, manifest)
    if backend_factory is None:
        backend = LocalShards([Shard(d, lo_s, v, verify=verify, use_gpu=use_gpu) for d, lo_s, v in specs])
    else:
        backend = backend_factory(specs, manifest.version_id)
    m = manifest
    b = ShardedBundle(path=path, manifest=m, backend=backend, chunks=chunks, lo=lo, labels=list(m.labels))
    b.index = _Index(b, IndexSpec(m.index.kind, m.index.params, m.index.reason))
    local = None
    if getattr(backend, "local_reads", False):  # shards in other processes: read their rows here where we can
        local = [map_local(x) for x in backend.call("memory_maps", [()] * len(specs))]
    b.kv = _sharded_memory(b, np.concatenate(starts), np.concatenate(counts), first, tok, local)
    b.token_spans = _Spans(spans, first)
    b.lexical = _Lexical(b, lex_parts) if lex_parts else None
    return b


# --- writing -----------------------------------------------------------------------------------------
def shard_ranges(n: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous row ranges, sizes differing by at most one (the first ones larger)."""
    if not 1 <= n_shards <= n:
        raise ValueError(f"shards must be between 1 and the number of chunks ({n}), got {n_shards}")
    q, r = divmod(n, n_shards)
    out, lo = [], 0
    for s in range(n_shards):
        hi = lo + q + (1 if s < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def slice_lexical(lex, lo: int, hi: int):
    """A bm25s retriever holding chunks lo..hi−1 of `lex` (a LexicalIndex over the whole KB): the
    same precomputed per-(term, chunk) scores (global idf and avgdl), chunk ids rebased to 0."""
    import bm25s

    s = lex.retriever.scores
    indices, indptr = np.asarray(s["indices"]), np.asarray(s["indptr"])
    keep = (indices >= lo) & (indices < hi)
    new_indptr = np.concatenate([[0], np.cumsum(keep)])[indptr].astype(indptr.dtype)
    spec = lex.spec
    r = bm25s.BM25(method=spec.method, k1=spec.k1, b=spec.b)
    r.scores = {"data": np.asarray(s["data"])[keep], "indices": (indices[keep] - lo).astype(indices.dtype),
                "indptr": new_indptr, "num_docs": hi - lo}
    r.vocab_dict = dict(lex.vocab)
    if getattr(lex.retriever, "nonoccurrence_array", None) is not None:  # BM25L/BM25+ only; lucene has none
        raise ValueError(f"sharding supports BM25 method 'lucene', not {spec.method!r}")
    r.nonoccurrence_array = None
    return r
