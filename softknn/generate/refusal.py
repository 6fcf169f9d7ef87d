"""Grounded refusal: when the KB does not hold the answer, say so instead of guessing, decided from
retrieval alone, before any decoding.

The signal is the encoder path's abstain gate (softknn.retrieval.calibration, rule "gated"): s₁, the
nearest chunk's dense similarity e_q·e_c over the KB (`Retrieval.nearest`; over the chunks that pass
the request's filter where it has one). A question is grounded when s₁ ≥ t; below t the answer is
REFUSAL_TEXT, with the evidence retrieval did find, and the generator never runs.

t is chosen per KB at build time from the KB's own pseudo-questions, the unlabelled λ calibration's
held-out sentences (softknn.retrieval.calibration.pseudo_queries): a sentence held out of a chunk is
the question, the chunk without it (re-embedded) stands in for its answer, and s₁ is taken over the KB
with every such stand-in in place, chunks that hold the sentence verbatim left out (the chunker's
overlap: a user's question is not KB text). t is the value below which at most REFUSAL_QUANTILE of
them fall. A held-out sentence is a harder question than a user's: the chunk that answers it has
lost the sentence itself, so real answerable questions fall below t less often than the quantile
(measured per KB by bench/gen_refusal.py; docs/generation.md, "Grounded refusal").

Dense s₁ and not the hybrid score: hybrid and lexical scores are min-max normalised per query (the
top chunk scores 1 whatever it is), and raw BM25 grows with the question's length and its words'
rarity; s₁ is the one absolute scale retrieval has.

The record is `refusal` in the manifest's `generator.calibration`; a bundle without it never refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from softknn.retrieval.calibration import pseudo_queries

REFUSAL_TEXT = "The knowledge base does not hold an answer to this question."
SIGNAL = "nearest_similarity"
REFUSAL_QUANTILE = 0.03  # the share of the KB's held-out sentences refused at t
REFUSAL_QUESTIONS = 800  # held-out sentences (as the unlabelled λ calibration's PSEUDO_QUERIES)
REFUSAL_MIN = 20  # fewer: no threshold, the bundle never refuses
METHOD = ("held-out sentences of the KB's own chunks, each against the KB with its chunk's stand-in (the chunk "
          "without the sentence) in place (softknn.generate.refusal)")
_BLOCK = 256  # pseudo-questions scored against the KB at a time


@dataclass(frozen=True)
class Grounding:
    """The verdict on one question: `grounded` None when nothing was judged (no retrieval, or a bundle
    without a threshold); `refused` when the answer is REFUSAL_TEXT."""

    grounded: bool | None
    refused: bool
    signal: str | None
    value: float | None  # s₁ of this question
    threshold: float | None
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


def refusal_threshold(scores: np.ndarray, quantile: float = REFUSAL_QUANTILE) -> float:
    """t = the (⌊quantile·n⌋ + 1)-th smallest of scores (n,): at most ⌊quantile·n⌋ of them are < t."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if s.size == 0:
        raise ValueError("refusal_threshold needs at least one score")
    return float(s[min(int(math.floor(quantile * s.size + 1e-9)), s.size - 1)])


def pseudo_nearest(xb: np.ndarray, texts: list[str], embed: Callable[[list[str]], np.ndarray], *,
                   max_questions: int = REFUSAL_QUESTIONS, seed: int = 0) -> tuple[np.ndarray, list[tuple[int, str, str]]]:
    """(s₁ (n,) float32 of each held-out sentence, the (chunk row, sentence, stand-in) triples).

    s₁_j = max over chunks i of e_j·x_i, where x = xb (N, D) with every pseudo-question's chunk replaced
    by its stand-in's embedding, and chunks other than j's own that contain sentence j verbatim left out."""
    pq = pseudo_queries(texts, max_questions, seed)
    if not pq:
        return np.zeros(0, dtype=np.float32), pq
    n = len(pq)
    emb = np.asarray(embed([q for _, q, _ in pq] + [s for _, _, s in pq]), dtype=np.float32)  # (2n, D)
    eq, es = emb[:n], emb[n:]
    kb = np.array(xb, dtype=np.float32)  # (N, D)
    kb_texts = list(texts)
    for j, (c, _, s) in enumerate(pq):
        kb[c] = es[j]
        kb_texts[c] = s
    s1 = np.empty(n, dtype=np.float32)
    for start in range(0, n, _BLOCK):
        D = eq[start : start + _BLOCK] @ kb.T  # (B, N)
        for b, d in enumerate(D):
            c, q, _ = pq[start + b]
            s1[start + b] = _nearest_not_verbatim(d, c, q, kb_texts)
    return s1, pq


def _nearest_not_verbatim(d: np.ndarray, own: int, query: str, kb_texts: list[str]) -> float:
    """max d_i over rows i that are `own` or do not hold `query` verbatim (nearest first: few checks)."""
    m = min(16, len(d))
    top = np.argpartition(-d, m - 1)[:m]
    for order in (top[np.argsort(-d[top])], np.argsort(-d)):  # the 16 nearest, then all rows
        for i in order:
            if i == own or query not in kb_texts[i]:
                return float(d[i])
    return float(d[own])


def calibrate_refusal(xb: np.ndarray, texts: list[str], embed: Callable[[list[str]], np.ndarray], *,
                      quantile: float = REFUSAL_QUANTILE, max_questions: int = REFUSAL_QUESTIONS,
                      min_questions: int = REFUSAL_MIN, seed: int = 0,
                      outcomes: tuple[np.ndarray, list] | None = None) -> dict:
    """The `refusal` record of the manifest's generator calibration (module doc).

    xb (N, D): the chunks' embeddings; embed(texts) → (n, D) float32 as the build embeds an input;
    `outcomes`: this KB's pseudo_nearest at these max_questions and seed, when already computed."""
    s1, pq = outcomes if outcomes is not None else pseudo_nearest(xb, texts, embed, max_questions=max_questions,
                                                                   seed=seed)
    base = {"signal": SIGNAL, "method": METHOD, "seed": seed, "quantile": quantile, "questions": len(pq)}
    if len(pq) < min_questions:
        return {**base, "threshold": None,
                "note": f"fewer than {min_questions} chunks with a sentence to hold out: no threshold, never refuses"}
    t = refusal_threshold(s1, quantile)
    return {**base, "threshold": t,
            "rule": (f"refuse when the nearest chunk's dense similarity is below the threshold: the value below "
                     f"which at most {quantile:g} of the KB's held-out sentences fall"),
            "refused_questions": round(float((s1 < t).mean()), 6),
            "pseudo_quantiles": {f"{x:g}": round(float(np.quantile(s1, x)), 6) for x in (0.01, 0.03, 0.05, 0.1, 0.5)}}


def judge(nearest: float | None, record: dict | None, refuse: bool = True) -> Grounding:
    """The verdict for a question whose s₁ is `nearest` (None: no retrieval ran), under the bundle's
    refusal record (None: built without one); `refuse` False reports the verdict but never refuses."""
    t = (record or {}).get("threshold")
    if nearest is None:
        return Grounding(None, False, None, None, t, "no retrieval (use_kb false): not judged")
    if t is None:
        why = (record or {}).get("note") or "the bundle was built without a refusal threshold"
        return Grounding(None, False, SIGNAL, float(nearest), None, f"{why}: never refuses")
    grounded = float(nearest) >= float(t)
    if grounded:
        note = f"nearest chunk similarity {nearest:.3f} ≥ {t:.3f}"
    else:
        note = (f"nearest chunk similarity {nearest:.3f} < {t:.3f}: " +
                ("refused" if refuse else "answered anyway (refuse false)"))
    return Grounding(grounded, not grounded and refuse, SIGNAL, float(nearest), float(t), note)
