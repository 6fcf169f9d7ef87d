"""Evaluation metrics as pure functions of ranked ids, labels and scores (no model, no I/O).

Binary relevance, gold set G, ranked unique ids r_1, r_2, …:
    recall@k = |G ∩ {r_1..r_k}| / |G|
    nDCG@k   = Σ_{i≤k, r_i∈G} 1/log2(i+1) / Σ_{i≤min(k,|G|)} 1/log2(i+1)
    MRR@k    = 1 / min{i ≤ k : r_i ∈ G}, 0 when no gold id is in the top k
    accuracy = mean(pred = gold), an abstention or no prediction counting as wrong
    macro-F1 = mean over labels (gold ∪ predicted) of 2·tp / (2·tp + fp + fn)
Abstain (reject when the top label score < t), over in-scope queries:
    rejection(t) = P(score < t);  answered accuracy(t) = P(correct | score ≥ t)
    loss(t) = P(correct) − P(correct ∧ score ≥ t)   (the right answers given up)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The abstain rules and their threshold choice live in the core, where the builder's calibration
# uses them too; re-exported here beside the other metrics.
from softknn.retrieval.calibration import RULES, abstain_point, calibrate_rules, choose_threshold, gated_scores  # noqa: F401


# --- ranking and classification ---------------------------------------------------------------
def recall_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    return len(gold.intersection(ranked[:k])) / len(gold)


def ndcg_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, r in enumerate(ranked[:k]) if r in gold)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(gold))))
    return dcg / ideal


def mrr_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    return next((1.0 / (i + 1) for i, r in enumerate(ranked[:k]) if r in gold), 0.0)


def retrieval_metrics(ranked: list[Sequence[str]], gold: list[Sequence[str]], ks: Sequence[int] = (1, 5, 10),
                      depth: int = 10) -> dict:
    """Means over queries with a non-empty gold set; `ranked` lists are unique ids, best first."""
    pairs = [(r, set(g)) for r, g in zip(ranked, gold, strict=True) if g]
    if not pairs:
        return {"n": 0}
    out: dict = {"n": len(pairs)}
    for k in ks:
        out[f"recall@{k}"] = float(np.mean([recall_at_k(r, g, k) for r, g in pairs]))
    out[f"ndcg@{depth}"] = float(np.mean([ndcg_at_k(r, g, depth) for r, g in pairs]))
    out[f"mrr@{depth}"] = float(np.mean([mrr_at_k(r, g, depth) for r, g in pairs]))
    return out


def classification_metrics(gold: Sequence[str], pred: Sequence[str | None]) -> dict:
    """Accuracy and macro-F1 over labels in gold ∪ predictions; None predictions are wrong."""
    if not gold:
        return {"n": 0}
    labels = sorted(set(gold) | {p for p in pred if p is not None})
    tp = dict.fromkeys(labels, 0)
    fp = dict.fromkeys(labels, 0)
    fn = dict.fromkeys(labels, 0)
    for g, p in zip(gold, pred, strict=True):
        if p == g:
            tp[g] += 1
            continue
        fn[g] += 1
        if p is not None:
            fp[p] += 1
    f1 = [2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) if tp[c] + fp[c] + fn[c] else 0.0 for c in labels]
    return {"n": len(gold), "accuracy": sum(tp.values()) / len(gold), "macro_f1": float(np.mean(f1))}


def abstain_curve(scores: Sequence[float], correct: Sequence[bool], points: int = 101) -> list[dict]:
    """The trade-off at thresholds spread over the score quantiles (rejection 0 → 1)."""
    s = np.asarray(scores, dtype=np.float64)
    if not len(s):
        return []
    ts = np.unique(np.concatenate([[0.0], np.quantile(s, np.linspace(0, 1, points)), [np.inf]]))
    return [abstain_point(scores, correct, t) for t in ts]


def rejection_rate(scores: Sequence[float], t: float | None) -> float | None:
    return None if t is None or not len(scores) else float(np.mean(np.asarray(scores) < t))


def auroc(pos: Sequence[float], neg: Sequence[float]) -> float | None:
    """P(score_pos > score_neg) + ½·P(tie): how well a score separates in-scope (pos) from OOD (neg)."""
    if not len(pos) or not len(neg):
        return None
    allv = np.concatenate([np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)])
    _, inv, counts = np.unique(allv, return_inverse=True, return_counts=True)
    avg_rank = (np.cumsum(counts) - (counts - 1) / 2)[inv]  # 1-based ranks, ties averaged
    n1, n0 = len(pos), len(neg)
    return float((avg_rank[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
