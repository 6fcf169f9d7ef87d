"""The KB memory: a FAISS index over chunk embeddings, the chunks' layer-L token keys/values.

Vocabulary as in faiss: xb (N, D) the chunk embeddings, xq (B, D) queries, D/I the scores and ids
of a search (I = -1 where fewer than k exist). Scores are inner products of unit vectors.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import faiss
import numpy as np
import torch

from softknn.model.backends import IndexSpec  # the spec is the ChunkSearch seam's type; importers find it here too

log = logging.getLogger(__name__)

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")


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
FILTER_WIDEN = 16.0  # search_among: at most this many times the index's efSearch / nprobe
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
        """(B, N) float32: xq @ xbᵀ over every chunk, the scores every exact answer is computed from.
        A read-only xq (a shard actor's argument, deserialized by Ray from its object store) is copied:
        torch wraps only writable arrays without a warning, and the query is small."""
        return torch.from_numpy(np.require(xq, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])) @ self._xb_t.T

    def rows_dot(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        """(len(ids),) float32: xb[ids]·q for one query q (D,), from the in-memory copy.

        By torch, as `similarities`: its thread count is the model's setting, where numpy's BLAS
        starts a thread per core (on a loaded 2-core box a 2,500-row product took 12 ms that way,
        1 ms on one thread), and a filter's passing chunks can be many rows."""
        # copies (ids and q are small): an array Ray handed a shard actor is read-only, and torch warns on one
        rows = torch.from_numpy(np.array(ids, dtype=np.int64))
        qt = torch.from_numpy(np.array(q, dtype=np.float32, order="C"))
        return (self._xb_t.index_select(0, rows) @ qt).numpy()

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

    def search_among(self, xq: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """D, I (B, k'): the k' = min(k, |rows|) chunks of `rows` (ascending ids) with the largest
        xq·xb, by the index restricted to them (a FAISS ID selector: score desc, then id asc, exact
        for flat; HNSW and IVF search their graph or lists keeping passing ids only, wider by N/|rows|).
        A GPU index takes no selector: its rows are scored exactly (`search_rows_exact`)."""
        rows = np.asarray(rows, dtype=np.int64)
        k = max(1, min(int(k), len(rows)))
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if self.on_gpu:
            return self.search_rows_exact(xq, k, rows)
        fx: Any = faiss  # the faiss stubs name neither SearchParametersHNSW nor the parameters' keywords
        mask = np.zeros(self.ntotal, dtype=bool)
        mask[rows] = True
        bitmap = np.packbits(mask, bitorder="little")  # (⌈N/8⌉,) uint8, bit i = row i passes
        sel = fx.IDSelectorBitmap(self.ntotal, fx.swig_ptr(bitmap))
        kind, p = self.spec.kind, self.spec.params
        # a graph or list search meets passing chunks at their share of the KB: its breadth is scaled
        # by N/|rows| (at most FILTER_WIDEN×) so it finds about as many of them as an unfiltered search
        widen = min(FILTER_WIDEN, self.ntotal / len(rows))
        if kind == "hnsw":
            ef = int(p.get("efSearch", 128))
            params = fx.SearchParametersHNSW(sel=sel, efSearch=max(math.ceil(ef * widen), k))
        elif kind in ("ivf", "ivfpq"):
            nprobe = int(p.get("nprobe", 32))
            params = fx.SearchParametersIVF(sel=sel, nprobe=min(int(p.get("nlist", nprobe)), math.ceil(nprobe * widen)))
        else:
            params = fx.SearchParameters(sel=sel)
        if kind == "ivfpq":
            kk = min(len(rows), k * int(p.get("rerank", 4)))
            _, cand = self.index.search(xq, kk, params=params)
            return self._rerank(xq, cand, k)
        if kind != "flat":
            return self.index.search(xq, k, params=params)
        kk = min(k + 1, len(rows))
        D, I = self.index.search(xq, kk, params=params)
        tie = D[:, k - 1] == D[:, k] if kk > k else np.zeros(len(xq), dtype=bool)
        D, I = D[:, :k], I[:, :k].astype(np.int64)
        order = np.lexsort((I, -D), axis=1)
        D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
        for b in np.flatnonzero(tie):  # the boundary is a tie: (score desc, id asc) over every passing row
            D[b], I[b] = self.search_rows_exact(xq[b : b + 1], k, rows)
        return D, I

    def search_rows_exact(self, xq: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Brute force over `rows` only: s = xq·xb[rows], the top k by (score desc, id asc)."""
        rows = np.asarray(rows, dtype=np.int64)
        k = max(1, min(int(k), len(rows)))
        S = (torch.from_numpy(np.array(xq, dtype=np.float32, order="C"))
             @ self._xb_t.index_select(0, torch.from_numpy(rows)).T).numpy()  # (B, |rows|)
        D = np.empty((len(S), k), dtype=np.float32)
        I = np.empty((len(S), k), dtype=np.int64)
        for b in range(len(S)):
            D[b], I[b] = _best(S[b], rows, k)
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
