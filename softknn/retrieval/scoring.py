"""The similarity the external k-NN ranks by: dense, lexical (BM25) or a hybrid of both.

For one input with dense similarities d (N,) = e_q·e_c and BM25 scores b (N,) over the whole KB,
and a pool size m:

    norm_m(x)_c = clip((x_c − x_(m)) / (x_(1) − x_(m)), 0, 1)     x_(j): the j-th largest of x
    hybrid:  s_c = (1 − λ)·norm_m(d)_c + λ·norm_m(b)_c
    dense:   s_c = d_c
    lexical: s_c = norm_m(b)_c

norm_m is the min-max normalisation over each retriever's own top m (what hybrid search engines
mix), defined over the whole KB: a chunk outside a retriever's top m gets 0 from it. So every
chunk outside (dense top m) ∪ (BM25 top m) has s_c = 0, and the top k (k ≤ m) by s is found
among those 2m candidates exactly; `topk_reference` computes s over every chunk and is the
brute force that `exact: true` answers with and the tests compare the fast path to.
Ties are ordered as every search here: score desc, then chunk id asc.
"""

from __future__ import annotations

import numpy as np

from softknn.common.table import (  # noqa: F401 (re-exported: the fallbacks are the parameter table's)
    CANDIDATES,
    DEFAULT_TEMPERATURE,
    LEXICAL_WEIGHT,
    RETRIEVALS,
    default_mode,
)


def kth_largest(x: np.ndarray, m: int) -> float:
    """x_(m), the m-th largest value of x (m clipped to len(x)).

    Partitioned from the top (−x): np.partition(x, N − m) is far slower on BM25 vectors whose
    scores are mostly 0 (bench/hybrid_cost.py; figures in docs/benchmarks.md)."""
    m = max(1, min(int(m), len(x)))
    return float(-np.partition(-np.asarray(x), m - 1)[m - 1])


def norm_top(x: np.ndarray, top1: float, topm: float) -> np.ndarray:
    """clip((x − x_(m)) / (x_(1) − x_(m)), 0, 1), float64; 0 everywhere when x_(1) = x_(m)."""
    x = np.asarray(x, dtype=np.float64)
    span = top1 - topm
    if not span > 0:
        return np.zeros_like(x)
    return np.clip((x - topm) / span, 0.0, 1.0)


def mix(d_hat: np.ndarray, b_hat: np.ndarray, weight: float) -> np.ndarray:
    """s = (1 − λ)·d̂ + λ·b̂ (float64)."""
    return (1.0 - weight) * d_hat + weight * b_hat


def best(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of (scores, ids): score desc, then id asc."""
    order = np.lexsort((ids, -scores))[:k]
    return scores[order], ids[order]


def scores_reference(d: np.ndarray, b: np.ndarray | None, mode: str, weight: float, pool: int) -> np.ndarray:
    """s (N,) float64 over the whole KB, by the definitions above (the brute force)."""
    d = np.asarray(d, dtype=np.float64)
    if mode == "dense":
        return d
    assert b is not None, "lexical and hybrid retrieval need BM25 scores"
    b = np.asarray(b, dtype=np.float64)
    b_hat = norm_top(b, float(b.max()), kth_largest(b, pool))
    if mode == "lexical":
        return b_hat
    d_hat = norm_top(d, float(d.max()), kth_largest(d, pool))
    return mix(d_hat, b_hat, weight)


def topk_reference(d: np.ndarray, b: np.ndarray | None, k: int, mode: str, weight: float,
                   pool: int) -> tuple[np.ndarray, np.ndarray]:
    """(s, ids) of the k best chunks by `scores_reference`, score desc then id asc."""
    s = scores_reference(d, b, mode, weight, pool)
    return best(s, np.arange(len(s)), min(k, len(s)))


def top_m(b: np.ndarray, pool: int) -> np.ndarray:
    """The ids of b's m largest values (any order; ties at the m-th broken arbitrarily)."""
    m = max(1, min(int(pool), len(b)))
    return np.argpartition(-b, m - 1)[:m] if m < len(b) else np.arange(len(b))


def candidates(dense_ids: np.ndarray, lex_ids: np.ndarray) -> np.ndarray:
    """dense top m ∪ BM25 top m (ids, ascending)."""
    return np.union1d(dense_ids[dense_ids >= 0], lex_ids)


def topk_fast(dense_D: np.ndarray, dense_I: np.ndarray, d_of, b: np.ndarray, k: int, mode: str, weight: float,
              pool: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The top k by s from the candidates only, or None when the candidates cannot decide it.

    dense_D/dense_I: the dense search's top `pool` for this input (score desc; for lexical
    retrieval only its top 1, the abstain gate's nearest chunk, is needed); d_of(ids): exact
    dense similarities of any chunks; b (N,): BM25 over the KB. Returns (s, ids, cand) with cand
    the candidate ids (`topk_candidates` decides).
    """
    lex = top_m(b, pool)  # one partition gives the candidates, b_(1) and b_(m)
    cand = candidates(dense_I, lex)
    b_lex = b[lex]
    d_cand = None if mode == "lexical" else d_of(cand)
    return topk_candidates(dense_D, dense_I, cand, d_cand, b[cand], float(b_lex.max()), float(b_lex.min()), len(b),
                           k, mode, weight, pool)


def topk_candidates(dense_D: np.ndarray, dense_I: np.ndarray, cand: np.ndarray, d_cand: np.ndarray | None,
                    b_cand: np.ndarray, b_top1: float, b_topm: float, n: int, k: int, mode: str, weight: float,
                    pool: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`topk_fast` from its parts: the candidates `cand` (ids ascending: dense top ∪ BM25 top m of
    a KB of n chunks), their dense similarities and BM25 scores, and b_(1), b_(m) over the KB
    (a sharded KB merges them from every shard's own candidates: softknn.storage.shards).

    Every chunk outside the candidates has s = 0 (module docstring), so the answer is the
    reference's whenever the k-th best candidate scores > 0, or when the candidates are the whole
    KB; otherwise (0-score chunks compete for the last places, ordered by id over the whole KB)
    None, and the caller takes the brute force.
    """
    b_hat = norm_top(b_cand, b_top1, b_topm)
    if mode == "lexical":
        s = b_hat
    else:
        assert d_cand is not None, "hybrid retrieval needs the candidates' dense similarities"
        valid = dense_I >= 0
        d_top1 = float(dense_D[valid][0])
        d_topm = float(dense_D[valid][min(pool, n) - 1]) if valid.sum() >= min(pool, n) else None
        if d_topm is None:
            return None
        s = mix(norm_top(d_cand, d_top1, d_topm), b_hat, weight)
    kk = min(k, n)
    S, I = best(s, cand, kk)
    if len(cand) == n or (len(S) == kk and S[-1] > 0):
        return S, I, cand
    return None
