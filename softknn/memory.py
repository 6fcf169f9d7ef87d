"""The KB memory: a FAISS index over chunk embeddings, the chunks' layer-L token keys/values.

Vocabulary as in faiss: xb (N, D) the chunk embeddings, xq (B, D) queries, D/I the scores and ids
of a search (I = -1 where fewer than k exist). Scores are inner products of unit vectors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import torch

from softknn.attention import MemoryBatch

log = logging.getLogger(__name__)

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index and its parameters; stored in the manifest, so a bundle rebuilds from it."""

    kind: str  # flat | hnsw | ivf | ivfpq (never auto once chosen)
    params: dict
    reason: str = ""


def choose_index(n: int, d: int, requested: str = "auto", params: dict | None = None) -> IndexSpec:
    """Resolve `auto` by KB size; fill default parameters. See docs/benchmarks.md (ANN section)."""
    if requested not in INDEX_TYPES:
        raise ValueError(f"index type must be one of {INDEX_TYPES}, not {requested!r}")
    params = dict(params or {})
    kind, reason = requested, "requested"
    # Thresholds from bench/ann.py and bench/fused_forward.py (figures in docs/benchmarks.md, ANN
    # section): an exact scan grows linearly with the chunks and becomes a sizeable share of the
    # plain forward past the flat limit, while HNSW answers in a fraction of a millisecond at high
    # recall; IVF-PQ's recall plateaus too low at 1M and saves no memory here, since ChunkIndex
    # keeps the embeddings for exact search and re-ranking anyway.
    if requested == "auto":
        if n <= 20_000:
            kind, reason = "flat", f"{n} chunks ≤ 20,000: an exact scan costs less than a sixth of the forward pass"
        elif n <= 2_000_000:
            kind, reason = "hnsw", f"{n} chunks: HNSW (graph) for sub-linear search with high recall"
        else:
            kind, reason = "ivf", f"{n} chunks: IVF (exact distances in the probed lists) builds far faster than HNSW"
    if kind == "hnsw":
        params.setdefault("M", 32)
        params.setdefault("efConstruction", 80)
        params.setdefault("efSearch", 256)  # 128 gave recall@8 0.96 at 1M chunks; 256 gives 0.986
    elif kind in ("ivf", "ivfpq"):
        params.setdefault("nlist", max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))
        params.setdefault("nprobe", 32)
        if kind == "ivfpq":
            params.setdefault("m", _pq_subquantizers(d))
            params.setdefault("nbits", 8)
            params.setdefault("rerank", 4)  # search k·rerank codes, rescore exactly from xb
    return IndexSpec(kind, params, reason)


def _pq_subquantizers(d: int) -> int:
    for m in (d // 8, d // 4, d // 2, d):
        if m and d % m == 0:
            return m
    return d


def build_index(xb: np.ndarray, spec: IndexSpec, *, seed: int = 1234) -> faiss.Index:
    """A CPU FAISS index over xb (N, D) float32, inner-product metric.

    Built single-threaded: HNSW insertion and k-means order depend on thread scheduling, and the
    builder promises the same bytes for the same input.
    """
    n, d = xb.shape
    p = spec.params
    prev = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        if spec.kind == "flat":
            index: Any = faiss.IndexFlatIP(d)  # the faiss stubs name no attribute of the subclasses
        elif spec.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, int(p["M"]), faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = int(p["efConstruction"])
        elif spec.kind in ("ivf", "ivfpq"):
            quantizer = faiss.IndexFlatIP(d)
            nlist = int(p["nlist"])
            if spec.kind == "ivf":
                index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexIVFPQ(quantizer, d, nlist, int(p["m"]), int(p["nbits"]), faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = seed
            index.train(xb)
        else:
            raise ValueError(f"unknown index kind {spec.kind!r}")
        index.add(xb)
    finally:
        faiss.omp_set_num_threads(prev)
    return index


# The flat scan's prefilter (ChunkIndex._search_flat): below this many chunks a full scan costs
# < 1 ms and the codes are not worth their memory (N·D bytes, a quarter of the embeddings).
PREFILTER_MIN_CHUNKS = 8192
PREFILTER_FACTOR = 4  # candidates k' = 4·k rescored exactly; bench/fused_forward.py reports how many rows certify


def _sq8_prefilter(xb: np.ndarray, block: int = 65_536) -> tuple[faiss.Index, float]:
    """An 8-bit scalar-quantized copy of xb (per-dimension range) and its largest reconstruction error."""
    n, d = xb.shape
    sq = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq.train(xb)
    sq.add(xb)
    err = 0.0
    for i in range(0, n, block):
        x = xb[i : i + block]
        err = max(err, float(np.linalg.norm(sq.sa_decode(sq.sa_encode(x)) - x, axis=1).max()))
    return sq, err


def _best(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of (scores, ids) in the order every search promises: score desc, then id asc."""
    order = np.lexsort((ids, -scores))[:k]
    return scores[order], ids[order]


def gpu_available() -> bool:
    """True when faiss has GPU support and sees a device, and torch has CUDA; never raises."""
    try:
        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0 and torch.cuda.is_available()
    except Exception:  # a CPU-only faiss build without the symbol
        return False


class ChunkIndex:
    """Search over chunk embeddings: the FAISS index (possibly on GPU) and the exact fallback."""

    def __init__(self, index: faiss.Index, xb: np.ndarray, spec: IndexSpec, *, use_gpu: bool = False):
        self.spec = spec
        self.xb = xb  # (N, D) float32, memory-mapped: the exact path and the PQ re-ranker read it
        self.ntotal = int(index.ntotal)
        self._xb_t = torch.from_numpy(np.array(xb, dtype=np.float32))  # one in-memory copy, for exact search
        self.on_gpu = False
        if spec.kind == "hnsw":
            index.hnsw.efSearch = int(spec.params.get("efSearch", 128))  # type: ignore[attr-defined]  # faiss stubs
        if spec.kind in ("ivf", "ivfpq"):
            index.nprobe = int(spec.params.get("nprobe", 32))  # type: ignore[attr-defined]  # faiss stubs
        if use_gpu and spec.kind != "hnsw" and gpu_available():
            self._res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._res, 0, index)
            self.on_gpu = True
        self.index = index
        self._sq: faiss.Index | None = None  # the flat scan's 8-bit prefilter (see _search_flat)
        self._sq_err = 0.0
        self.prefilter_counts = {"certified": 0, "full_scan": 0}  # rows answered each way (benchmarks read it)
        if spec.kind == "flat" and not self.on_gpu and self.ntotal >= PREFILTER_MIN_CHUNKS:
            self._sq, self._sq_err = _sq8_prefilter(np.asarray(xb, dtype=np.float32))

    def search(self, xq: np.ndarray, k: int, *, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """D, I (B, k): the k chunks with the largest xq·xb (exact) or the index's answer (ANN)."""
        k = max(1, min(int(k), self.ntotal))
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if exact or (self.spec.kind == "flat" and k + 1 > self.ntotal):
            return self.search_exact(xq, k)
        if self.spec.kind == "flat":
            return self._search_flat(xq, k)
        if self.spec.kind == "ivfpq":
            kk = min(self.ntotal, k * int(self.spec.params.get("rerank", 4)))
            _, cand = self.index.search(xq, kk)
            return self._rerank(xq, cand, k)
        D, I = self.index.search(xq, k)
        return D, I

    def _search_flat(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact top k, as `search_exact` defines it (score desc, then id asc), found fast.

        With the 8-bit prefilter (KBs of ≥ PREFILTER_MIN_CHUNKS): scan the 8-bit codes (a quarter of
        the bytes) for the k' = PREFILTER_FACTOR·k best approximate scores ŝ, rescore those exactly,
        and keep the answer only where it is certified: every chunk j outside the k' has
        s_j ≤ ŝ_j + ‖x_j − x̂_j‖·‖q‖ ≤ ŝ_(k') + e_max·‖q‖ (Cauchy–Schwarz; e_max is measured over
        the whole KB when the index loads), so if the k-th best exact score among the k' is above
        that (with a 1e-4 margin for float round-off), no chunk outside can enter the top k. Rows
        that are not certified, and KBs without the prefilter, take faiss's full flat scan, asked
        for k+1: within the top k the order is made (score desc, id asc), and a row whose k-th and
        (k+1)-th scores tie (the boundary itself is a tie) is answered by `search_exact`. Scores
        can differ from the torch matmul's in the last bit; `exact=True` always takes the torch path.
        """
        D = np.full((len(xq), k), -np.inf, dtype=np.float32)
        I = np.full((len(xq), k), -1, dtype=np.int64)
        todo = np.arange(len(xq))
        if self._sq is not None:
            kk = min(self.ntotal, PREFILTER_FACTOR * k)
            Dq, Iq = self._sq.search(xq, kk)
            bound = Dq[:, -1] + self._sq_err * np.linalg.norm(xq, axis=1) + 1e-4
            left = []
            for b in range(len(xq)):
                cand = Iq[b][Iq[b] >= 0]
                s, ids = _best(self._xb_t.numpy()[cand] @ xq[b], cand, k)  # the in-memory copy, not the memory map
                if len(ids) == k and (kk == self.ntotal or s[-1] > bound[b]):
                    D[b], I[b] = s, ids
                else:
                    left.append(b)
            todo = np.asarray(left, dtype=np.int64)
            self.prefilter_counts["certified"] += len(xq) - len(todo)
            self.prefilter_counts["full_scan"] += len(todo)
        if len(todo):
            D[todo], I[todo] = self._scan_flat(xq[todo], k)
        return D, I

    def _scan_flat(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's full flat scan with the tie handling described in `_search_flat`."""
        D, I = self.index.search(xq, k + 1)
        boundary_tie = D[:, k - 1] == D[:, k]
        D, I = D[:, :k], I[:, :k]
        order = np.lexsort((I, -D), axis=1)  # last key first: score desc, then id asc
        D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
        if boundary_tie.any():
            rows = np.flatnonzero(boundary_tie)
            D[rows], I[rows] = self.search_exact(xq[rows], k)
        return D, I.astype(np.int64)

    def similarities(self, xq: np.ndarray) -> torch.Tensor:
        """(B, N) float32: xq @ xbᵀ over every chunk, the scores every exact answer is computed from."""
        return torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32)) @ self._xb_t.T

    def rows_dot(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        """(len(ids),) float32: xb[ids]·q for one query q (D,), from the in-memory copy."""
        return self._xb_t.numpy()[ids] @ np.asarray(q, dtype=np.float32)

    def search_exact(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Brute force: scores = xq @ xbᵀ, top-k; ties broken by the lower id."""
        scores = self.similarities(xq)  # (B, N)
        Dt, It = torch.topk(scores, k, dim=1, sorted=True)
        D, I = Dt.numpy(), It.numpy().astype(np.int64)
        # torch.topk picks among equal scores in no promised order: wherever the k-th score is
        # shared by a chunk left out, or ties sit inside the top k, re-select that row by (score desc, id asc)
        kth = D[:, k - 1 : k]
        at_kth = (scores.numpy() == kth).sum(1)
        inside = (D[:, :-1] == D[:, 1:]).any(1) if k > 1 else np.zeros(len(D), dtype=bool)
        for b in np.flatnonzero((at_kth > (D == kth).sum(1)) | inside):
            row = scores[b].numpy()
            cand = np.flatnonzero(row >= kth[b, 0])
            D[b], I[b] = _best(row[cand], cand, k)
        return D, I

    def _rerank(self, xq: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        D = np.full((len(xq), k), -np.inf, dtype=np.float32)
        I = np.full((len(xq), k), -1, dtype=np.int64)
        for b, ids in enumerate(cand):
            ids = ids[ids >= 0]
            s = self.xb[ids] @ xq[b]  # exact scores of the PQ candidates
            order = np.argsort(-s, kind="stable")[:k]
            D[b, : len(order)], I[b, : len(order)] = s[order], ids[order]
        return D, I


class KVStore:
    """Per chunk, its non-special tokens' layer-L keys and values, and their char spans.

    keys/values (Ntok, nh, hs) memory-mapped; chunk c owns rows start[c] : start[c] + count[c].
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray, start: np.ndarray, count: np.ndarray):
        assert keys.shape == values.shape and keys.ndim == 3, (keys.shape, values.shape)
        self.keys, self.values = keys, values
        self.start, self.count = start, count
        self.num_heads, self.head_dim = keys.shape[1], keys.shape[2]

    def chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k_c, v_c (nh, n_c, hs) float32."""
        s, n = int(self.start[c]), int(self.count[c])
        kc = torch.from_numpy(np.array(self.keys[s : s + n], dtype=np.float32))  # (n, nh, hs)
        vc = torch.from_numpy(np.array(self.values[s : s + n], dtype=np.float32))
        return kc.transpose(0, 1), vc.transpose(0, 1)

    def rows(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) float32 of store rows `rows` (one fancy-index read each)."""
        return (torch.from_numpy(np.asarray(self.keys[rows], dtype=np.float32)),
                torch.from_numpy(np.asarray(self.values[rows], dtype=np.float32)))

    def attach(self, encoder, layer: int) -> None:
        """Stored K/V need no model (the hidden-state and recompute memories do: softknn.memory_repr)."""

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """Pad each input's chunks into a MemoryBatch: S = max |R|, Lm = the longest chunk.

        One fancy-index read of all retrieved token rows and one scatter straight into the padded
        (B, nh, S, Lm, hs) layout, instead of a copy per chunk into (B, S, Lm, nh, hs) followed by
        a permuted copy of the whole padded tensor. `gather_reference` is the per-chunk loop;
        tests compare the two.
        """
        return pad_memory(ids, weights, self.start, self.count, self.num_heads, self.head_dim, device, self.rows)

    def gather_reference(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """`gather` as a plain loop, one chunk at a time (the reference its tests compare with)."""
        def chunk(c: int) -> tuple[torch.Tensor, torch.Tensor]:
            st, n = int(self.start[c]), int(self.count[c])
            return (torch.from_numpy(np.array(self.keys[st : st + n], dtype=np.float32)),
                    torch.from_numpy(np.array(self.values[st : st + n], dtype=np.float32)))

        return pad_memory_reference(ids, weights, self.count, self.num_heads, self.head_dim, device, chunk)


RowsFn = Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]  # store rows -> k, v (n, nh, hs) float32


def pad_memory(ids: list[list[int]], weights: list[list[float]], start: np.ndarray, count: np.ndarray,
               nh: int, hs: int, device: torch.device, kv_rows: RowsFn) -> MemoryBatch:
    """The MemoryBatch of R = ids (per input, chunk rows) from any memory representation: `kv_rows`
    gives the K/V of all retrieved token rows in one call; they are scattered into (B, nh, S, Lm, hs)."""
    B = len(ids)
    S = max(1, max((len(r) for r in ids), default=1))
    counts = [[int(count[c]) for c in r] for r in ids]
    Lm = max(1, max((n for r in counts for n in r), default=1))
    bi, si, li, src = [], [], [], []  # per retrieved token: its (input, slot, position), its store row
    for b, (row, cnt) in enumerate(zip(ids, counts, strict=True)):
        for s, (c, n) in enumerate(zip(row, cnt, strict=True)):
            st = int(start[c])
            src.append(np.arange(st, st + n))
            li.append(np.arange(n))
            bi.append(np.full(n, b))
            si.append(np.full(n, s))
    key = torch.zeros(B, nh, S, Lm, hs)  # written in place through a (B, S, Lm, nh, hs) view: no permute copy
    value = torch.zeros(B, nh, S, Lm, hs)
    token_mask = torch.zeros(B, S, Lm, dtype=torch.bool)
    weight = torch.zeros(B, S)
    if src:
        at = tuple(torch.from_numpy(np.concatenate(x)) for x in (bi, si, li))
        k, v = kv_rows(np.concatenate(src))  # (n, nh, hs) each
        key.permute(0, 2, 3, 1, 4)[at] = k.to("cpu", torch.float32)
        value.permute(0, 2, 3, 1, 4)[at] = v.to("cpu", torch.float32)
        token_mask[at] = True
    for b, w in enumerate(weights):
        weight[b, : len(w)] = torch.tensor(w, dtype=torch.float32)
    return MemoryBatch(key=key.to(device), value=value.to(device), token_mask=token_mask.to(device),
                       weight=weight.to(device))


def pad_memory_reference(ids: list[list[int]], weights: list[list[float]], count: np.ndarray, nh: int, hs: int,
                         device: torch.device, kv_chunk: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> MemoryBatch:
    """`pad_memory` as a plain loop: `kv_chunk(c)` gives chunk c's k, v (n_c, nh, hs), one chunk at a time."""
    B = len(ids)
    S = max(1, max((len(r) for r in ids), default=1))
    Lm = max(1, max((int(count[c]) for r in ids for c in r), default=1))
    key = torch.zeros(B, S, Lm, nh, hs)
    value = torch.zeros(B, S, Lm, nh, hs)
    token_mask = torch.zeros(B, S, Lm, dtype=torch.bool)
    weight = torch.zeros(B, S)
    for b, row in enumerate(ids):
        for s, c in enumerate(row):
            n = int(count[c])
            kc, vc = kv_chunk(c)
            key[b, s, :n], value[b, s, :n] = kc.float().cpu(), vc.float().cpu()
            token_mask[b, s, :n] = True
            weight[b, s] = weights[b][s]
    return MemoryBatch(
        key=key.permute(0, 3, 1, 2, 4).contiguous().to(device),  # (B, nh, S, Lm, hs)
        value=value.permute(0, 3, 1, 2, 4).contiguous().to(device),
        token_mask=token_mask.to(device),
        weight=weight.to(device),
    )
