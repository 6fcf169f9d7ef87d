"""The abstain rules and their calibration: the build-time leave-one-out over a labelled KB's own index.

The rules (RULES) and how their thresholds are chosen from outcomes (choose_threshold,
calibrate_rules) live here, below both apps: the builder calibrates every labelled bundle with
them (calibrate_loo), the evaluation app on a held-out split (softknn.evaluation.holdout) and reports
them (softknn.evaluation.metrics re-exports them).

Leave-one-out:

Each labelled chunk c, as a query (its stored embedding e_c and its own text's BM25 terms),
retrieves from the other chunks (c itself removed from the dense and BM25 score vectors before
the normalisation); its Nadaraya–Watson label estimate Σ_R w_db·onehot(label) is right or wrong.
Leave-one-out cross-validation is the standard bandwidth selection of Nadaraya–Watson regression
(seed 001: bandwidth ≈ temperature), and it needs no second bundle:

1. the hybrid similarity's lexical weight λ and its bandwidth τ: the grid cell with the best
   leave-one-out accuracy, where it beats dense's by more than CELL_SE standard errors of the paired
   difference, else dense (choose_cell: the best of 36 cells is an optimistic estimate; Banking77:
   λ 0.3, τ 0.25 → 92.62%, dense 92.26%; bench/hybrid_banking77.py, bench/oos_refusal.py);
2. the abstain rule at that cell: abstain when the nearest chunk's dense similarity s₁ < s_min or
   the top label score < t (calibrate_rules: s_min spends half the budget, t the rest), spending
   0.75 of the in-scope accuracy budget on leave-one-out, so the budget holds on new queries:
   calibrated at the full budget, the loss exceeded it in 50–65% of 20 KB-side splits, with the
   0.75 margin in 15% (bench/hybrid_banking77.py, docs/quality.md). The half share is fixed:
   choosing it per KB from leave-one-label-out pseudo out-of-scope queries bought little more
   refusal of intents the KB lacks for more in-scope loss than the budget allows
   (bench/oos_refusal.py, docs/quality.md).

The record is stored as the manifest's `calibration`; the engine reads its thresholds and the
retrieval defaults it chose (`retrieval_defaults`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from softknn.model.attention import knn_weights_row
from softknn.retrieval.lexical import LexicalIndex
from softknn.retrieval.scoring import DEFAULT_TEMPERATURE, LEXICAL_WEIGHT, best, kth_largest, mix, norm_top

LEXICAL_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
TEMPERATURES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4)
BUDGET_MARGIN = 0.75
MAX_QUERIES = 10_000  # leave-one-out queries (a seeded sample beyond this): ~1–2 ms each on one core
GATE_SHARE = 0.5  # the share of the loss budget the s_1 gate spends (calibrate_rules)
CELL_SE = 1.0  # a hybrid cell must beat dense by this many paired standard errors


# --- abstention rules -------------------------------------------------------------------------
# "score": abstain when the top label score < t (what a request's own abstain_threshold applies).
# "gated": also abstain when the nearest chunk's similarity s_1 < s_min; the engine applies it
# whenever the bundle's calibration holds an s_min (softknn.infer.engine.Engine._predict). w_db is normalised over R,
# so the top label score cannot tell "the neighbours agree" from "the neighbours are close": an
# out-of-domain input whose k nearest chunks share a label scores as high as an in-scope one
# (Banking77 validation: ObliQA questions, docs/quality.md). s_1 carries the missing absolute scale.
RULES = {"score": "abstain when the top label score < t (the engine)",
         "gated": "abstain when the nearest chunk's similarity < s_min or the top label score < t (proposed)"}


def abstain_point(scores: Sequence[float] | np.ndarray, correct: Sequence[bool], t: float) -> dict:
    """The trade-off at threshold t: rejection rate, answered accuracy, in-scope accuracy loss."""
    s, c = np.asarray(scores, dtype=np.float64), np.asarray(correct, dtype=bool)
    keep = s >= t
    return {
        "threshold": float(t),
        "rejection_rate": float(1 - keep.mean()),
        "answered_accuracy": float(c[keep].mean()) if keep.any() else None,
        "accuracy_loss": float(c.mean() - (c & keep).mean()),
    }


def choose_threshold(scores: Sequence[float] | np.ndarray, correct: Sequence[bool], target_loss: float) -> float:
    """The largest t (0 or an observed score) with loss(t) ≤ target_loss: most rejection for that cost."""
    s = np.asarray(scores, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    best = 0.0
    for t in np.unique(s):  # loss(t) is non-decreasing in t
        if c.mean() - (c & (s >= t)).mean() <= target_loss + 1e-12:
            best = float(t)
        else:
            break
    return best


def gated_scores(scores: Sequence[float], similarity: Sequence[float], s_min: float | None) -> np.ndarray:
    """The top label score where s_1 ≥ s_min, else −1 (below any threshold): rule "gated" as one score."""
    s = np.asarray(scores, dtype=np.float64)
    return s if s_min is None else np.where(np.asarray(similarity, dtype=np.float64) >= s_min, s, -1.0)


def gate_thresholds(scores: Sequence[float], similarity: Sequence[float], correct: Sequence[bool], budget: float,
                    share: float = GATE_SHARE) -> tuple[float, float]:
    """(s_min, t) of rule "gated": s_min spends `share` of the loss budget on s_1 alone, t the rest
    given the gate."""
    s_min = choose_threshold(similarity, correct, share * budget)
    return s_min, max(0.0, choose_threshold(gated_scores(scores, similarity, s_min), correct, budget))


def refused(scores, similarity, s_min: float, t: float) -> np.ndarray:
    """Rule "gated"'s verdicts (n,) bool: s_1 < s_min or top label score < t (Engine._predict)."""
    return (np.asarray(similarity) < s_min) | (np.asarray(scores) < t)


def calibrate_rules(scores: Sequence[float], similarity: Sequence[float], correct: Sequence[bool],
                    target_loss: float) -> dict:
    """Thresholds on validation: "score" spends the whole loss budget on t; "gated" spends half on
    s_min (similarity alone), then the rest on t given the gate."""
    s_min, t = gate_thresholds(scores, similarity, correct, target_loss)
    return {"score": {"threshold": choose_threshold(scores, correct, target_loss)},
            "gated": {"min_similarity": s_min, "threshold": t}}


# --- leave-one-out over the KB ----------------------------------------------------------------
def _top_k(s: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of s (score desc, id asc) without sorting all of s."""
    if len(s) > k:
        keep = s >= np.partition(s, len(s) - k)[len(s) - k]
        s, ids = s[keep], ids[keep]
    return best(s, ids, k)


def _votes(scores: np.ndarray, rows: np.ndarray, label_ids: np.ndarray, n_labels: int, taus, kernel: str):
    """Per τ: (top label id or −1, its score) of Σ_R w_db·onehot(label), ties to the lower label id
    (name order, as evidence.label_scores). The softmax kernel for every τ at once, with
    knn_weights_row's arithmetic (float64, rounded to float32); other kernels through it."""
    s = np.asarray(scores, dtype=np.float32).astype(np.float64)
    if kernel == "softmax":
        z = s[None, :] / np.asarray(taus, dtype=np.float64)[:, None]  # (T, k)
        e = np.exp(z - z.max(1, keepdims=True))
        w = (e / e.sum(1, keepdims=True)).astype(np.float32).astype(np.float64)
    else:
        w = np.stack([knn_weights_row(s, t, kernel).astype(np.float64) for t in taus])
    lab = label_ids[rows]
    onehot = np.zeros((len(rows), n_labels))
    has = lab >= 0
    onehot[np.flatnonzero(has), lab[has]] = 1.0
    acc = w @ onehot  # (T, L)
    top = acc.argmax(1)
    score = acc[np.arange(len(taus)), top]
    return [(int(t) if sc > 0 else -1, float(sc)) for t, sc in zip(top, score, strict=True)]


def _hybrid_top_k(d: np.ndarray, b: np.ndarray, ids: np.ndarray, lam: float, k: int, m: int, cand: np.ndarray,
                  d_hat: np.ndarray, b_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top k by the hybrid s among the candidates (both top-m lists), where s = 0 outside them;
    the whole of d, b when 0-score chunks would compete for the last places (retrieval.topk_fast)."""
    S, I = best(mix(d_hat, b_hat, lam), ids[cand], k)
    if len(S) == k and S[-1] > 0:
        return S, I
    full = mix(norm_top(d, float(d.max()), kth_largest(d, m)), norm_top(b, float(b.max()), kth_largest(b, m)), lam)
    return _top_k(full, ids, k)


def _cell_grid(lexical, weights, temperatures) -> list[tuple]:
    """The (retrieval, λ, τ) cells: dense at its default τ, then hybrid λ × τ when there is a lexical index."""
    cells: list[tuple] = [("dense", None, DEFAULT_TEMPERATURE["dense"])]
    if lexical is not None:
        cells += [("hybrid", lam, tau) for lam in weights for tau in temperatures]
    return cells


def query_votes(d: np.ndarray, b: np.ndarray | None, ids: np.ndarray, label_ids: np.ndarray, n_labels: int,
                cells: Sequence[tuple], *, k: int, candidates: int, kernel: str = "softmax") -> dict:
    """One query over the chunks `ids` (d, b: (n,) its dense and BM25 scores there; b None for dense
    cells only): per cell (retrieval, λ, τ), (top label id or −1, its score Σ_R w_db·onehot)."""
    k = min(k, len(d))
    by_weight: dict[tuple, list[float]] = {}
    for r, lam, tau in cells:
        by_weight.setdefault((r, lam), []).append(tau)
    out: dict[tuple, tuple[int, float]] = {}
    if ("dense", None) in by_weight:
        taus = by_weight.pop(("dense", None))
        S, I = _top_k(d, ids, k)
        out |= {("dense", None, t): v for t, v in zip(taus, _votes(S, I, label_ids, n_labels, taus, kernel), strict=True)}
    if by_weight:
        assert b is not None, "hybrid cells need the BM25 scores"
        mm = min(candidates, len(d))
        cand = np.union1d(np.argpartition(-d, mm - 1)[:mm], np.argpartition(-b, mm - 1)[:mm])
        d_hat = norm_top(d[cand], float(d.max()), kth_largest(d, candidates))
        b_hat = norm_top(b[cand], float(b.max()), kth_largest(b, candidates))
        for (r, lam), taus in by_weight.items():
            S, I = _hybrid_top_k(d, b, ids, lam, k, candidates, cand, d_hat, b_hat)
            out |= {(r, lam, t): v for t, v in zip(taus, _votes(S, I, label_ids, n_labels, taus, kernel), strict=True)}
    return out


def label_index(labels: list[str | None]) -> tuple[list[str], np.ndarray]:
    """(the label names sorted, each chunk's index into them (n,) int64, −1 where unlabelled)."""
    names = sorted({x for x in labels if x is not None})
    index_of = {x: i for i, x in enumerate(names)}
    return names, np.array([index_of[x] if x is not None else -1 for x in labels], dtype=np.int64)


def _sample(rows: np.ndarray, max_queries: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(rows, max_queries, replace=False)) if len(rows) > max_queries else rows


def loo_outcomes(xb: np.ndarray, labels: list[str | None], texts: list[str], lexical, *, k: int, candidates: int,
                 kernel: str = "softmax", weights=LEXICAL_WEIGHTS, temperatures=TEMPERATURES,
                 max_queries: int = MAX_QUERIES, seed: int = 0) -> dict:
    """Leave-one-out over the labelled chunks: per grid cell, who was right and the top label score.

    Returns {"rows", "s1" (n,), "cells": {(retrieval, λ, τ): {"ok" (n,) bool, "score" (n,)}}}; with
    `lexical` None only the dense cell (τ = DEFAULT_TEMPERATURE["dense"]) is computed.
    """
    names, label_ids = label_index(labels)
    rows = _sample(np.flatnonzero(label_ids >= 0), max_queries, seed)
    xb = np.ascontiguousarray(xb, dtype=np.float32)
    cells = _cell_grid(lexical, weights, temperatures)
    got: dict[tuple, dict] = {key: {"ok": [], "score": []} for key in cells}
    s1 = []
    all_ids = np.arange(len(xb))
    for start in range(0, len(rows), 256):
        block = rows[start : start + 256]
        dense = xb[block] @ xb.T  # (B, N)
        for j, c in enumerate(block):
            keep = all_ids != c  # (N,)
            d = dense[j][keep].astype(np.float64)
            s1.append(float(d.max()))
            b = None if lexical is None else lexical.scores(lexical.analyzer.terms(texts[c]))[keep].astype(np.float64)
            for key, (top, score) in query_votes(d, b, all_ids[keep], label_ids, len(names), cells, k=k,
                                                 candidates=candidates, kernel=kernel).items():
                got[key]["ok"].append(top == label_ids[c])
                got[key]["score"].append(score)
    return {"rows": rows, "s1": np.asarray(s1), "cells": {key: {"ok": np.asarray(v["ok"], dtype=bool),
                                                               "score": np.asarray(v["score"])}
                                                         for key, v in got.items()}}


def choose_cell(out: dict, se_width: float = CELL_SE) -> tuple[tuple, dict]:
    """The cell the bundle serves: the best hybrid cell (ties to the smaller λ, then τ) where its
    leave-one-out accuracy beats dense's by more than `se_width` standard errors of the paired
    difference, else dense. Returns (the cell, what was compared)."""
    cells = out["cells"]
    acc = {key: float(v["ok"].mean()) for key, v in cells.items()}
    dense_key = next(key for key in acc if key[0] == "dense")
    hybrid = [key for key in acc if key[0] == "hybrid"]
    if not hybrid:
        return dense_key, {}
    top = max(hybrid, key=lambda key: (acc[key], -key[1], -key[2]))
    diff = cells[top]["ok"].astype(np.float64) - cells[dense_key]["ok"]  # (n,) paired: −1, 0, +1
    se = float(diff.std() / np.sqrt(len(diff))) if len(diff) else 0.0
    gain = acc[top] - acc[dense_key]
    chosen = top if gain > se_width * se + 1e-12 else dense_key
    return chosen, {"best_hybrid": {"lexical_weight": top[1], "temperature": top[2], "accuracy": acc[top]},
                    "gain": gain, "se": se, "rule": f"hybrid only where its gain over dense > {se_width:g} paired SE"}


def calibrate_loo(xb: np.ndarray, labels: list[str | None], texts: list[str], lexical, *, k: int, candidates: int,
                  kernel: str = "softmax", target_loss: float = 0.01, margin: float = BUDGET_MARGIN,
                  max_queries: int = MAX_QUERIES, seed: int = 0,
                  outcomes: dict | None = None) -> dict:
    """The manifest's calibration record from leave-one-out (module docstring); `outcomes`: this
    KB's loo_outcomes when already computed."""
    out = outcomes if outcomes is not None else loo_outcomes(xb, labels, texts, lexical, k=k, candidates=candidates,
                                                             kernel=kernel, max_queries=max_queries, seed=seed)
    acc = {key: float(v["ok"].mean()) for key, v in out["cells"].items()}
    dense_key = next(key for key in acc if key[0] == "dense")
    chosen, compared = choose_cell(out)
    ok, score, s1 = out["cells"][chosen]["ok"], out["cells"][chosen]["score"], out["s1"]
    rules = calibrate_rules(score, s1, ok, margin * target_loss)
    t_score, s_min, t = rules["score"]["threshold"], rules["gated"]["min_similarity"], rules["gated"]["threshold"]
    retrieval, lam, tau = chosen
    defaults = {retrieval: {"temperature": tau, **({"lexical_weight": lam} if lam is not None else {})}}
    return {
        "method": "leave-one-out over the KB at build time (softknn.retrieval.calibration)",
        "abstain_threshold": t_score,
        "min_similarity": s_min,
        "abstain_threshold_gated": t,
        "rules": RULES,
        "retrieval_defaults": defaults,
        "params": {"k": k, "temperature": tau, "kernel": kernel, "retrieval": retrieval,
                   **({"lexical_weight": lam} if lam is not None else {})},
        "target_loss": target_loss,
        "budget_margin": margin,
        "leave_one_out": {
            "n": int(len(out["rows"])),
            "candidates": candidates,
            "accuracy": {"dense": acc[dense_key], "chosen": acc[chosen]},
            "cell_choice": compared,
            "grid": [{"retrieval": r, "lexical_weight": lw, "temperature": t_, "accuracy": round(a, 6)}
                     for (r, lw, t_), a in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2]))],
            "score_rule": {k_: v for k_, v in abstain_point(score, ok, t_score).items() if k_ != "threshold"},
            "gated_rule": {k_: v for k_, v in abstain_point(gated_scores(score, s1, s_min), ok, t).items()
                           if k_ != "threshold"},
            "s1_quantiles": {f"{q:g}": float(np.quantile(s1, q)) for q in (0.005, 0.01, 0.05, 0.5)},
        },
    }


# --- an unlabelled KB: λ from pseudo-queries --------------------------------------------------
# An unlabelled KB has no right answers to leave one out with, so it makes its own: a sentence held
# out of a chunk is the query, and the chunk minus that sentence (its stand-in, re-embedded and
# re-indexed for BM25) is the one right answer. The query's words are gone from its chunk, so
# BM25 can only find it through the vocabulary the rest of the chunk shares with it, as it finds a
# user's chunk. A chunk of one sentence makes no pseudo-query (halves of one sentence share
# too little for either retriever: on Banking77 utterances, MRR@10 ≈ 0.005 at every λ in a first
# run of bench/unlabelled_lambda.py).
# Other chunks that hold the query verbatim (the chunker's overlap, duplicated text) are left out
# of that query's search. λ is the smallest grid value (nearest dense) whose mean reciprocal rank
# of the right chunk in the top 10 is within two standard errors (of the paired difference) of the
# best λ's: pseudo-queries are sentences of the KB, not users' questions, so a λ must beat dense
# clearly on them to be chosen; where they cannot tell, the dense side is the one users' questions
# favoured (bench/unlabelled_lambda.py). τ is not chosen: the ranking does not depend on it, and
# without labels nothing scores the weights w_db it sets.
# With fewer than PSEUDO_MIN pseudo-queries nothing is measured: the fixed LEXICAL_WEIGHT stays.
# Where even the best λ's pseudo-queries rarely find their chunk (MRR@10 < PSEUDO_MIN_MRR; Banking77's
# utterances: 0.01–0.04, the Python topics and ObliQA 0.15–0.35) they cannot tell the λs apart, and
# their choice moved with the seed (0 to 0.7): dense. Up to PSEUDO_QUERIES = 800 of them: with 200,
# the full ObliQA KB's choice was 0, 0.2 or 0.2 by seed against a best real-query λ of 0.6
# (docs/benchmarks.md, "An unlabelled KB's own λ").
PSEUDO_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
PSEUDO_QUERIES = 800  # held-out sentences: up to 1,600 texts encoded at build time (200 left λ to the seed: docs/benchmarks.md)
PSEUDO_MIN = 20  # fewer usable chunks: λ stays at the fixed default
PSEUDO_MIN_MRR = 0.1  # the best λ's pseudo-query MRR@10 below this: they cannot tell λs apart, dense (λ 0)
PSEUDO_MIN_WORDS = 3  # a query and a stand-in keep at least this many words
PSEUDO_SE = 2.0  # how many standard errors below the best a smaller λ may score and still be chosen
PSEUDO_TOP = 10
PSEUDO_METHOD = "pseudo-queries: held-out sentences of the KB's own chunks (softknn.retrieval.calibration)"
_SENTENCE = re.compile(r"(?<=[.!?:;])\s+|\n+")


def held_out(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """(query, stand-in) from one chunk text: a seeded sentence and the rest; None when the chunk
    has fewer than two sentences of ≥ PSEUDO_MIN_WORDS words."""
    parts = [s.strip() for s in _SENTENCE.split(text) if len(s.split()) >= PSEUDO_MIN_WORDS]
    if len(parts) < 2:
        return None
    i = int(rng.integers(len(parts)))
    return parts[i], " ".join(parts[:i] + parts[i + 1 :])


def pseudo_queries(texts: list[str], max_queries: int = PSEUDO_QUERIES, seed: int = 0) -> list[tuple[int, str, str]]:
    """[(chunk row, query, stand-in)] for up to max_queries chunks, a seeded sample, in row order."""
    rng = np.random.default_rng(seed)
    out = []
    for c in rng.permutation(len(texts)).tolist():
        pair = held_out(texts[c], rng)
        if pair is not None:
            out.append((c, *pair))
            if len(out) == max_queries:
                break
    return sorted(out)


def calibrate_unlabelled(xb: np.ndarray, texts: list[str], spec, embed, *, candidates: int,
                         weights=PSEUDO_WEIGHTS, max_queries: int = PSEUDO_QUERIES, min_queries: int = PSEUDO_MIN,
                         se_width: float = PSEUDO_SE, min_mrr: float = PSEUDO_MIN_MRR, seed: int = 0) -> dict:
    """The manifest's calibration record of an unlabelled KB with a lexical index (comment above).

    spec: the bundle's LexicalSpec; embed(texts) -> (n, D) float32 embeddings as the build computes them."""
    pq = pseudo_queries(texts, max_queries, seed)
    base = {"abstain_threshold": None, "source": "pseudo-queries", "method": PSEUDO_METHOD}
    if len(pq) < min_queries:
        return {**base, "retrieval_defaults": {},
                "pseudo_queries": {"n": len(pq), "note": f"fewer than {min_queries} chunks with a sentence to hold out: "
                                   f"λ stays at the fixed default {LEXICAL_WEIGHT}"}}
    rows = np.array([c for c, _, _ in pq])
    emb = np.asarray(embed([q for _, q, _ in pq] + [s for _, _, s in pq]), dtype=np.float32)
    eq, es = emb[: len(pq)], emb[len(pq) :]
    kb = np.array(xb, dtype=np.float32)
    kb[rows] = es
    kb_texts = list(texts)
    for c, _, s in pq:
        kb_texts[c] = s
    lex = LexicalIndex.build(kb_texts, spec)
    rr = np.zeros((len(weights), len(pq)))
    dense_rr = np.zeros(len(pq))
    for j, (c, q, _) in enumerate(pq):
        keep = np.array([i == c or q not in t for i, t in enumerate(kb_texts)])
        d = (kb @ eq[j]).astype(np.float64)[keep]
        b = lex.scores(lex.analyzer.terms(q)).astype(np.float64)[keep]
        target = int(np.count_nonzero(keep[:c]))
        dense_rr[j] = _reciprocal_rank(d, target)
        d_hat = norm_top(d, float(d.max()), kth_largest(d, candidates))
        b_hat = norm_top(b, float(b.max()), kth_largest(b, candidates))
        for w, lam in enumerate(weights):
            rr[w, j] = _reciprocal_rank(mix(d_hat, b_hat, lam), target)
    mean = rr.mean(1)
    chosen, top, se = choose_weight(rr, se_width)
    blind = float(mean[top]) < min_mrr  # e.g. one-sentence utterances: halves share too little
    if blind:
        chosen = int(np.flatnonzero(np.asarray(weights) == 0.0)[0]) if 0.0 in weights else chosen
    lam = float(weights[chosen])
    return {**base, "retrieval_defaults": {"hybrid": {"lexical_weight": lam}},
            "params": {"retrieval": "hybrid", "lexical_weight": lam},
            "pseudo_queries": {
                "n": len(pq), "seed": seed, "candidates": candidates, "metric": f"MRR@{PSEUDO_TOP}",
                "rule": (f"the smallest λ within {se_width:g} standard errors of the best MRR; dense (λ 0) when "
                         f"the best MRR is below {min_mrr:g}"),
                **({"note": f"the best pseudo-query MRR@{PSEUDO_TOP} {float(mean[top]):.3f} is below "
                            f"{min_mrr:g}: they cannot tell the λs apart, so dense"} if blind else {}),
                "dense_mrr": round(float(dense_rr.mean()), 6), "best_lexical_weight": float(weights[top]),
                "grid": [{"lexical_weight": float(x), "mrr": round(float(m), 6), "top1": round(float((rr[w] == 1).mean()), 6),
                          "se_to_best": round(float(se[w]), 6)} for w, (x, m) in enumerate(zip(weights, mean, strict=True))],
                "temperature": "not chosen: the default (the ranking does not depend on it; no labels score w_db)"}}


def choose_weight(rr: np.ndarray, se_width: float = PSEUDO_SE) -> tuple[int, int, np.ndarray]:
    """rr (W, n): each grid λ's reciprocal ranks over the same n queries. Returns (the chosen row:
    the first whose mean is within `se` standard errors of the paired difference to the best row,
    the best row (the first of equal means), the standard errors (W,))."""
    mean = rr.mean(1)
    top = int(np.argmax(mean))
    se = np.array([np.std(rr[w] - rr[top]) / np.sqrt(rr.shape[1]) for w in range(len(rr))])
    return next(w for w in range(len(rr)) if mean[w] >= mean[top] - se_width * se[w] - 1e-12), top, se


def _reciprocal_rank(s: np.ndarray, target: int) -> float:
    """1/rank of row `target` by (score desc, row asc) if within PSEUDO_TOP, else 0."""
    ahead = int(np.count_nonzero(s > s[target]) + np.count_nonzero(s[:target] == s[target]))
    return 1.0 / (ahead + 1) if ahead < PSEUDO_TOP else 0.0
