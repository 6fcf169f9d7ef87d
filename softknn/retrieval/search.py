"""Retrieval over a bundle alone: the request parameters, R per input and why (no model).

`Retriever(bundle)` turns query embeddings (and, for lexical and hybrid retrieval, the input
texts) into R, its similarities and w_db, through the bundle's chunk search (softknn.model.backends.
ChunkSearch: one FAISS index or the shards) and BM25 index; the score math is softknn.retrieval.scoring.
The Engine (softknn.infer.engine) holds one and adds the model: the embedding before, the fused pass after.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from softknn.common.table import MIXING, InferParams, ResolvedParams  # noqa: F401 (re-exported)
from softknn.model.attention import knn_weights_row, truncation_bound_row
from softknn.model.backends import ChunkSearch
from softknn.retrieval.filters import ChunkTable, FilterNode
from softknn.retrieval.scoring import best, topk_candidates, topk_fast, topk_reference

if TYPE_CHECKING:
    from softknn.storage.layout import Bundle
    from softknn.storage.shards import ShardedBundle

# A filtered search scores the passing chunks by brute force up to this many (the flat index's own
# auto limit: such a scan costs a fraction of the forward pass), and past it when they are under
# this share of an HNSW or IVF index, whose graph or lists, searched for the passing ids only, lose
# recall as the share falls; otherwise the index searches restricted to them (an ID selector).
FILTER_SCAN_MAX = 20_000
FILTER_INDEX_SHARE = 0.1


@dataclass
class Retrieval:
    """R per input and why: each chunk's ranking similarity s_c, its dense e_q·e_c and BM25 score."""

    rows: list[list[int]]  # R per input, in rank order
    scores: list[list[float]]  # s_c, the similarity R was ranked by (softknn.retrieval.scoring)
    weights: list[list[float]]  # w_db over R
    bound: list[float]  # truncation bound per input
    searched: list[str]  # "exact" or the index kind
    dense: list[list[float]]  # e_q·e_c of each chunk in R
    bm25: list[list[float] | None]  # BM25(q, c) of each chunk in R (None: dense retrieval)
    nearest: list[float]  # the largest e_q·e_c over the KB (the abstain gate's s_1)
    words: list[list[tuple[str, str]] | None]  # the input's analysed words: (term, the word as written)
    filtered: list[int | None]  # chunks that pass the input's filter (None: no filter)

    @classmethod
    def empty(cls, n: int) -> Retrieval:
        return cls([[]] * n, [[]] * n, [[]] * n, [0.0] * n, [""] * n, [[]] * n, [None] * n, [-1.0] * n, [None] * n,
                   [None] * n)


class Retriever:
    """R over one bundle (a softknn.storage.layout.Bundle or softknn.storage.shards.ShardedBundle): its chunk
    search (`index`), BM25 index (`lexical`, None when built without one) and calibration."""

    def __init__(self, bundle: Bundle | ShardedBundle):
        assert bundle.index is not None, "a loaded bundle has its chunk search"
        self.bundle = bundle
        self.index: ChunkSearch = bundle.index
        self._table: ChunkTable | None = None
        self._table_lock = threading.Lock()

    @property
    def table(self) -> ChunkTable:
        """The KB's filterable fields as columns, read from the chunks once: when a server opens the bundle
        (warm_filters), else on the first filter."""
        if self._table is None:
            with self._table_lock:
                if self._table is None:
                    self._table = ChunkTable.of(self.bundle.chunks)
        return self._table

    def warm_filters(self) -> None:
        """Read the filter columns now (a server opening a bundle), not on the first filtered request."""
        _ = self.table

    def passing(self, f: FilterNode) -> np.ndarray:
        """The rows (ascending) of the chunks that pass filter f."""
        return np.flatnonzero(self.table.mask(f))

    def resolve(self, params: list[InferParams]) -> list[ResolvedParams]:
        """Validated, with the retrieval and temperature this bundle serves them with."""
        cal = self.bundle.manifest.calibration.retrieval_defaults
        return [p.validate().resolved(self.bundle.lexical is not None, cal) for p in params]

    def retrieve(self, xq: np.ndarray, params: list[ResolvedParams], texts: list[str] | None = None) -> Retrieval:
        """R and w_db per input (params resolved). Inputs sharing (exact, retrieval, search size) are
        searched together. Lexical and hybrid retrieval need the input `texts` for BM25."""
        n = len(self.bundle)
        out = Retrieval.empty(len(params))
        groups: dict[tuple[bool, str, int], list[int]] = {}
        passing: dict[int, np.ndarray] = {}  # a request's inputs share one filter object: evaluated once
        for i, p in enumerate(params):
            if p.filter is not None:
                rows = passing.get(id(p.filter))
                if rows is None:
                    rows = passing[id(p.filter)] = self.passing(p.filter)
                self._filtered(out, i, xq[i], None if texts is None else texts[i], p, rows)
                continue
            size = p.search_size(n)
            # hybrid: the dense top m are candidates and set the normalisation; lexical: only the nearest (s₁)
            dsize = {"dense": size, "lexical": 1}.get(p.retrieval, min(n, max(size, p.candidates)))
            groups.setdefault((p.exact, p.retrieval, dsize), []).append(i)
        index = self.index
        for (exact, mode, dsize), members in groups.items():
            kind = "exact" if exact or index.spec.kind == "flat" else index.spec.kind
            if mode == "dense":
                D, I = index.search(xq[members], dsize, exact=exact)
                for j, i in enumerate(members):
                    self.select(out, i, D[j], I[j], D[j], None, params[i], n, kind)
                    out.nearest[i] = float(D[j][0])
                continue
            assert texts is not None, "lexical and hybrid retrieval need the input texts"
            if hasattr(self.bundle, "lexical_candidates"):  # a sharded KB: each shard its own candidates
                self._sharded_lexical(out, xq, texts, members, params, dsize, exact, n, kind)
                continue
            if exact:
                d_all = index.similarities(xq[members]).numpy()  # (B, N) the brute force's dense scores
            else:
                D, I = index.search(xq[members], dsize)
            for j, i in enumerate(members):
                self._lexical_select(out, i, xq[i], texts[i], d_all[j] if exact else None,
                                     None if exact else (D[j], I[j]), params[i], n, kind)
        return out

    def _lexical_select(self, out: Retrieval, i: int, q: np.ndarray, text: str, d_all: np.ndarray | None,
                        dense_top: tuple[np.ndarray, np.ndarray] | None, p: ResolvedParams, n: int, kind: str) -> None:
        """R for one input by the hybrid or lexical similarity: from the candidates when they decide
        it (softknn.retrieval.scoring.topk_fast), else (and always with exact) by brute force over the KB."""
        lex, index = self.bundle.lexical, self.index
        assert lex is not None, "resolve() refuses lexical and hybrid retrieval without a lexical index"
        words = lex.analyzer.words(text)
        b = lex.scores([t for t, _, _ in words])  # (N,) BM25 over every chunk
        size = p.search_size(n)
        found = None
        if dense_top is not None:
            found = topk_fast(dense_top[0], dense_top[1], lambda ids: index.rows_dot(ids, q), b, size,
                              p.retrieval, p.lexical_weight, p.candidates)
        if found is None or dense_top is None:  # found implies dense_top: the second test is for the type checker
            d = d_all if d_all is not None else index.similarities(q[None])[0].numpy()
            S, ids = topk_reference(d, b, size, p.retrieval, p.lexical_weight, p.candidates)
            dense, nearest = d[ids], float(d.max())
        else:
            S, ids, _ = found
            dense, nearest = index.rows_dot(ids, q), float(dense_top[0][0])
        self.select(out, i, S, ids, dense, b[ids], p, n, kind)
        out.nearest[i], out.words[i] = nearest, [(t, text[s:e]) for t, s, e in words]

    def _sharded_lexical(self, out: Retrieval, xq: np.ndarray, texts: list[str], members: list[int],
                         params: list[ResolvedParams], dsize: int, exact: bool, n: int, kind: str) -> None:
        """`_lexical_select` for the inputs `members` of a sharded KB: the candidates, their scores and
        the normalisation's b_(1), b_(m) come from every shard's own top lists in one call
        (ShardedBundle.lexical_candidates), not a BM25 (and with exact a dense) score of every chunk;
        the same answer (softknn.retrieval.scoring.topk_candidates). When the candidates cannot decide it,
        the brute force over the KB (`_lexical_select` with no dense top)."""
        lex, bundle = self.bundle.lexical, cast("ShardedBundle", self.bundle)
        assert lex is not None, "resolve() refuses lexical and hybrid retrieval without a lexical index"
        words = [lex.analyzer.words(texts[i]) for i in members]
        parts = bundle.lexical_candidates(xq[members], [[t for t, _, _ in w] for w in words], dsize,
                                               [params[i].candidates for i in members], exact)
        for i, w, (dD, dI, cand, d_cand, b_cand, b1, bm) in zip(members, words, parts, strict=True):
            p = params[i]
            found = topk_candidates(dD, dI, cand, d_cand, b_cand, b1, bm, n, p.search_size(n), p.retrieval,
                                    p.lexical_weight, p.candidates)
            if found is None:
                self._lexical_select(out, i, xq[i], texts[i], None, None, p, n, kind)
                continue
            S, ids, _ = found
            at = np.searchsorted(cand, ids)
            self.select(out, i, S, ids, d_cand[at], b_cand[at], p, n, kind)
            out.nearest[i], out.words[i] = float(dD[0]), [(t, texts[i][s:e]) for t, s, e in w]

    def _filtered(self, out: Retrieval, i: int, q: np.ndarray, text: str | None, p: ResolvedParams,
                  rows: np.ndarray) -> None:
        """R for one input as over a KB of the chunks `rows` (ascending) alone: dense similarities, the
        hybrid normalisation and candidates, the abstain gate's s_1 and the truncation bound over those
        chunks; BM25 scores with the whole KB's statistics (docs/design.md, "Filters").

        Up to FILTER_SCAN_MAX passing chunks (or a share below FILTER_INDEX_SHARE of an HNSW or IVF
        index), and always with `exact`, the passing chunks are scored by brute force; past that the
        index searches restricted to them (ChunkSearch.search_among)."""
        n, index = len(rows), self.index
        out.filtered[i] = n
        out.searched[i] = "exact"
        if n == 0:
            return  # R = ∅: the plain layer; no chunk can be drawn on
        size = p.search_size(n)
        kind = index.spec.kind
        scan = p.exact or n <= FILTER_SCAN_MAX or (kind != "flat" and n < FILTER_INDEX_SHARE * len(self.bundle))
        d = None
        if p.exact:
            d = index.similarities(q[None])[0].numpy()[rows]  # (n,) the unfiltered exact path's scores
        elif scan:
            d = index.rows_dot(rows, q)  # (n,)
        if not scan and kind != "flat":
            out.searched[i] = kind
        if p.retrieval == "dense":
            if d is not None:
                S, I = best(np.asarray(d, dtype=np.float32), rows, size)
            else:
                D, I2 = index.search_among(q[None], size, rows)
                S, I = D[0], I2[0]
            self.select(out, i, S, I, S, None, p, n, out.searched[i])
            found_any = I >= 0  # an HNSW or IVF search can come back short of passing chunks
            out.nearest[i] = float(S[found_any][0]) if found_any.any() else -1.0
            return
        lex = self.bundle.lexical
        assert lex is not None and text is not None, "lexical and hybrid retrieval need the index and the text"
        words = lex.analyzer.words(text)
        b = lex.scores([t for t, _, _ in words])[rows]  # (n,) BM25 with the whole KB's N, df and avgdl
        found = None
        if d is None:
            dsize = 1 if p.retrieval == "lexical" else min(n, max(size, p.candidates))
            D, I2 = index.search_among(q[None], dsize, rows)
            local = np.where(I2[0] >= 0, np.searchsorted(rows, I2[0]), -1)  # ids into rows
            found = topk_fast(D[0], local, lambda ids: index.rows_dot(rows[ids], q), b, size, p.retrieval,
                              p.lexical_weight, p.candidates)
            if found is not None:
                S, ids, _ = found
                dense, nearest = index.rows_dot(rows[ids], q), float(D[0][0])
        if found is None:
            d = index.rows_dot(rows, q) if d is None else d
            S, ids = topk_reference(d, b, size, p.retrieval, p.lexical_weight, p.candidates)
            dense, nearest = d[ids], float(np.max(d))
        self.select(out, i, S, rows[ids], dense, b[ids], p, n, out.searched[i])
        out.nearest[i], out.words[i] = nearest, [(t, text[s:e]) for t, s, e in words]

    def select(self, out: Retrieval, i: int, D: np.ndarray, I: np.ndarray, dense: np.ndarray,
                bm25: np.ndarray | None, p: ResolvedParams, n: int, kind: str) -> None:
        """R from the ranked (D, I) (s_c desc): the top k, or top k + threshold from the pool."""
        keep = I >= 0
        sel = np.flatnonzero(keep)
        D, I = D[keep], I[keep]
        k = min(p.k, len(I))
        if p.threshold is not None and len(I) > k:  # top-k ∪ {c in the pool : w(c) ≥ threshold}
            mask = np.arange(len(I)) < k
            mask |= knn_weights_row(np.ascontiguousarray(D, dtype=np.float32), p.temperature, p.kernel) >= p.threshold
        else:
            mask = np.arange(len(I)) < k
        sel, D, I = sel[mask], D[mask], I[mask]
        D = np.ascontiguousarray(D, dtype=np.float32)
        w = knn_weights_row(D, p.temperature, p.kernel)
        nz = w > 0  # compact kernels: a chunk outside the window is not in R
        out.rows[i] = I[nz].tolist()
        out.scores[i] = D[nz].tolist()
        out.weights[i] = w[nz].tolist()
        out.dense[i] = np.asarray(dense, dtype=np.float64)[sel][nz].tolist()
        out.bm25[i] = None if bm25 is None else np.asarray(bm25, dtype=np.float64)[sel][nz].tolist()
        out.bound[i] = truncation_bound_row(D, n, p.temperature, p.kernel)
        out.searched[i] = kind

    def matched_words(self, retr: Retrieval, b: int, row: int) -> list[str] | None:
        """The input's words (as written, first occurrence) whose term occurs in chunk `row`."""
        words = retr.words[b]
        if words is None or self.bundle.lexical is None:
            return None
        hit = self.bundle.lexical.matched([t for t, _ in words], row)
        return list(dict.fromkeys(w for t, w in words if t in hit))

    def matched_words_rows(self, retr: Retrieval, b: int, rows: list[int]) -> list[list[str] | None]:
        """`matched_words` for each chunk of rows, the postings searched once for all of them."""
        words = retr.words[b]
        if words is None or self.bundle.lexical is None:
            return [None] * len(rows)
        hits = self.bundle.lexical.matched_rows([t for t, _ in words], rows)
        return [list(dict.fromkeys(w for t, w in words if t in hit)) for hit in hits]
