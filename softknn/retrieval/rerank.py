"""Scoring given texts against a query with the similarity the retrieval ranks KB chunks by.

`POST /v1/rerank` scores texts that need not be in the KB. Each text t is scored as if it were
one more chunk of the KB, with the KB's own statistics (softknn.retrieval.scoring's notation):

    d_t = e_q·e_t                                   the plain model's embeddings
    b_t = BM25(q, t) with the KB's N, df and avgdl    (Lucene BM25 as softknn.retrieval.lexical)
    hybrid:  s_t = (1 − λ)·norm_m(d)_t + λ·norm_m(b)_t
    dense:   s_t = d_t
    lexical: s_t = norm_m(b)_t

where norm_m uses the KB's x_(1) and x_(m) for this query (the dense search's top m, BM25 over
every chunk), exactly the normalisation the retrieval applies. So a KB chunk's own text scores
its retrieval similarity s_c (up to the round-off of re-encoding it), and any text ranks where
the retrieval would have ranked it. A query word the KB never uses has no KB statistics and
counts for nothing, as in the retrieval. `raw` leaves out the clip to [0, 1] (texts beyond the
KB's best or below its m-th keep their order instead of tying at 1 or 0).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from softknn.retrieval.scoring import kth_largest

if TYPE_CHECKING:
    from softknn.retrieval.lexical import Analyzer, LexicalSpec
    from softknn.retrieval.search import InferParams, Retriever


@dataclass(frozen=True)
class LexicalStats:
    """The KB's BM25 statistics: N chunks, their mean analysed length, each term's document frequency.

    Lengths as the index counts them: a chunk with no kept word counts as one (softknn.retrieval.lexical
    indexes it as the empty term)."""

    n: int
    avgdl: float
    df: dict[str, int]

    @classmethod
    def of(cls, texts: list[str], analyzer: Analyzer) -> LexicalStats:
        df: Counter[str] = Counter()
        total = 0
        for text in texts:
            terms = analyzer.terms(text)
            total += max(1, len(terms))
            df.update(set(terms))
        return cls(len(texts), total / max(1, len(texts)), dict(df))


def bm25_texts(query_terms: list[str], texts_terms: list[list[str]], stats: LexicalStats,
               spec: LexicalSpec) -> np.ndarray:
    """BM25(q, t) (len(texts),) float64 for each text's terms, with the KB's statistics:
    Σ_{term ∈ q, df > 0} idf · tf / (tf + k1·(1 − b + b·|t|/avgdl)), idf = ln(1 + (N − df + 0.5)/(df + 0.5)),
    repeated query terms counted each time (softknn.retrieval.lexical.bm25_reference's formula)."""
    out = np.zeros(len(texts_terms), dtype=np.float64)
    idf = {t: math.log(1 + (stats.n - stats.df[t] + 0.5) / (stats.df[t] + 0.5)) for t in set(query_terms)
           if stats.df.get(t)}
    for j, terms in enumerate(texts_terms):
        tf = Counter(terms)
        norm = spec.k1 * (1 - spec.b + spec.b * max(1, len(terms)) / stats.avgdl)
        out[j] = sum(idf[t] * tf[t] / (tf[t] + norm) for t in query_terms if t in idf and tf.get(t))
    return out


def normalise(x: np.ndarray, top1: float, topm: float, *, clip: bool = True) -> np.ndarray:
    """(x − x_(m)) / (x_(1) − x_(m)), clipped to [0, 1] unless `clip` is false; 0 where x_(1) = x_(m)."""
    x = np.asarray(x, dtype=np.float64)
    span = top1 - topm
    if not span > 0:
        return np.zeros_like(x)
    y = (x - topm) / span
    return np.clip(y, 0.0, 1.0) if clip else y


def kb_range(values: np.ndarray, pool: int) -> tuple[float, float]:
    """(x_(1), x_(m)) of a KB-wide score vector."""
    return float(np.max(values)), kth_largest(values, pool)


def scores(mode: str, d: np.ndarray, d_range: tuple[float, float] | None, b: np.ndarray | None,
           b_range: tuple[float, float] | None, weight: float, *, raw: bool = False) -> np.ndarray:
    """s_t of every text by the module docstring's definitions (float64)."""
    if mode == "dense":
        return np.asarray(d, dtype=np.float64)
    assert b is not None and b_range is not None, "lexical and hybrid scores need BM25 and the KB's range"
    b_hat = normalise(b, *b_range, clip=not raw)
    if mode == "lexical":
        return b_hat
    assert d_range is not None, "hybrid scores need the KB's dense range"
    return (1.0 - weight) * normalise(d, *d_range, clip=not raw) + weight * b_hat


class Reranker:
    """The rerank scores over one bundle's retrieval (softknn.retrieval.search.Retriever): its chunk search
    gives the dense range, its BM25 index the lexical range and the analyzer; the KB's lexical
    statistics are counted from its chunk texts once, on first use (a pass over the KB's text)."""

    def __init__(self, retriever: Retriever):
        self.retriever = retriever
        self._stats: LexicalStats | None = None
        self._lock = threading.Lock()

    def stats(self) -> LexicalStats:
        with self._lock:
            if self._stats is None:
                bundle = self.retriever.bundle
                assert bundle.lexical is not None, "only lexical and hybrid scores need the statistics"
                self._stats = LexicalStats.of([c["text"] for c in bundle.chunks], bundle.lexical.analyzer)
            return self._stats

    def score(self, e_q: np.ndarray, e_texts: np.ndarray, query: str, texts: list[str], p: InferParams, *,
              raw: bool = False) -> np.ndarray:
        """s_t (len(texts),) float64 of each text for the query, by params `p` (resolved:
        Retriever.resolve) — retrieval, lexical_weight, candidates (m)."""
        assert p.retrieval is not None and p.lexical_weight is not None, "params resolved (Retriever.resolve)"
        e_q = np.asarray(e_q, dtype=np.float32)
        d = np.asarray(e_texts, dtype=np.float64) @ e_q.astype(np.float64)
        if p.retrieval == "dense":
            return d
        bundle, index = self.retriever.bundle, self.retriever.index
        n = len(bundle)
        m = max(1, min(p.candidates, n))
        d_range = None
        if p.retrieval == "hybrid":
            D, I = index.search(e_q[None], m, exact=p.exact)
            top = D[0][I[0] >= 0]
            if len(top) >= m:
                d_range = (float(top[0]), float(top[m - 1]))
            else:  # the ANN found fewer than m: the retrieval's brute force normalises over every chunk
                d_range = kb_range(index.similarities(e_q[None])[0].numpy(), m)
        lex = bundle.lexical
        assert lex is not None, "Retriever.resolve refuses lexical and hybrid retrieval without a lexical index"
        q_terms = lex.analyzer.terms(query)
        b_range = kb_range(lex.scores(q_terms), m)
        b = bm25_texts(q_terms, [lex.analyzer.terms(t) for t in texts], self.stats(), lex.spec)
        return scores(p.retrieval, d, d_range, b, b_range, p.lexical_weight, raw=raw)
