"""Build-time calibration by leave-one-out: the grid against a plain loop, the record in
the manifest, and a labelled bundle that abstains out of the box."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.infer.engine import InferParams
from softknn.infer.evidence import label_scores
from softknn.model.attention import knn_weights_row
from softknn.retrieval.calibration import (
    calibrate_loo,
    calibrate_rules,
    choose_cell,
    gate_thresholds,
    loo_outcomes,
    query_votes,
    refused,
)
from softknn.retrieval.lexical import LexicalIndex
from softknn.retrieval.scoring import best, scores_reference

WORDS = "ferry dog refund ticket cabin storm harbour bike luggage wheelchair timetable cafe".split()


def _toy_kb(n: int = 60, seed: int = 3):
    rng = np.random.default_rng(seed)
    xb = rng.normal(size=(n, 16)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    labels = [None if i % 7 == 0 else f"l{i % 4}" for i in range(n)]
    texts = [" ".join(rng.choice(WORDS, size=5)) for _ in range(n)]
    return xb, labels, texts


def test_leave_one_out_cells_equal_a_plain_loop():
    xb, labels, texts = _toy_kb()
    lex = LexicalIndex.build(texts)
    k, m = 5, 10
    out = loo_outcomes(xb, labels, texts, lex, k=k, candidates=m, weights=(0.3, 0.6), temperatures=(0.1, 0.25))
    rows = [i for i, x in enumerate(labels) if x is not None]
    assert out["rows"].tolist() == rows
    assert list(out["cells"]) == [("dense", None, 0.05)] + [("hybrid", lam, tau) for lam in (0.3, 0.6)
                                                            for tau in (0.1, 0.25)]

    def others_of(c):
        return np.array([j for j in range(len(xb)) if j != c])

    for (mode, lam, tau), cell in out["cells"].items():
        want_ok, want_score = [], []
        for c in rows:
            others = others_of(c)
            d = xb[others].astype(np.float64) @ xb[c].astype(np.float64)
            b = lex.scores(lex.analyzer.terms(texts[c]))[others]
            s = scores_reference(d, b, mode, lam or 0.0, m)
            S, I = best(s, others, k)
            w = knn_weights_row(S.astype(np.float32), tau)
            scores = label_scores([labels[j] for j in I], w.tolist())
            top, score = next(iter(scores.items()), (None, 0.0))
            want_ok.append(top == labels[c])
            want_score.append(score)
        assert cell["ok"].tolist() == want_ok, (mode, lam, tau)
        np.testing.assert_allclose(cell["score"], want_score, atol=1e-6)
    assert out["s1"] == pytest.approx([max((xb @ xb[c])[others_of(c)]) for c in rows], abs=1e-6)


def test_calibration_serves_the_cell_choose_cell_picks_and_spends_the_margin_of_the_budget():
    xb, labels, texts = _toy_kb(120)
    lex = LexicalIndex.build(texts)
    rec = calibrate_loo(xb, labels, texts, lex, k=5, candidates=20)
    grid = rec["leave_one_out"]["grid"]
    hybrid = [g for g in grid if g["retrieval"] == "hybrid"]
    assert len(hybrid) == 36
    top = max(g["accuracy"] for g in hybrid)
    choice = rec["leave_one_out"]["cell_choice"]
    assert choice["best_hybrid"]["accuracy"] == pytest.approx(top, abs=1e-6)
    if choice["gain"] > choice["se"]:
        assert rec["retrieval_defaults"] == {"hybrid": {"lexical_weight": choice["best_hybrid"]["lexical_weight"],
                                                        "temperature": choice["best_hybrid"]["temperature"]}}
    else:
        assert rec["retrieval_defaults"] == {"dense": {"temperature": 0.05}}
    assert rec["leave_one_out"]["gated_rule"]["accuracy_loss"] <= 0.75 * 0.01 + 1e-12
    assert rec["leave_one_out"]["score_rule"]["accuracy_loss"] <= 0.75 * 0.01 + 1e-12
    # the thresholds: calibrate_rules at the served cell (s_min half of 0.75 × 1%, t the rest)
    out = loo_outcomes(xb, labels, texts, lex, k=5, candidates=20)
    p = rec["params"]
    cell = out["cells"][(p["retrieval"], p.get("lexical_weight"), p["temperature"])]
    want = calibrate_rules(cell["score"], out["s1"], cell["ok"], 0.75 * 0.01)
    assert (rec["abstain_threshold"], rec["min_similarity"], rec["abstain_threshold_gated"]) == (
        want["score"]["threshold"], want["gated"]["min_similarity"], want["gated"]["threshold"])
    assert "gate" not in rec
    assert calibrate_loo(xb, labels, texts, lex, k=5, candidates=20, outcomes=out) == rec
    dense_only = calibrate_loo(xb, labels, texts, None, k=5, candidates=20)
    assert dense_only["retrieval_defaults"] == {"dense": {"temperature": 0.05}}


def _outcomes(dense_ok, hybrid_ok):
    return {"cells": {("dense", None, 0.05): {"ok": np.array(dense_ok, dtype=bool)},
                      ("hybrid", 0.3, 0.25): {"ok": np.array(hybrid_ok, dtype=bool)}}}


def test_choose_cell_keeps_dense_unless_the_hybrid_beats_it_by_a_paired_standard_error():
    dense = [True] * 90 + [False] * 10
    # two more right, none lost: gain 0.02 > SE sqrt(0.02 − 0.02²)/10 = 0.0140
    cell, why = choose_cell(_outcomes(dense, [True] * 92 + [False] * 8))
    assert cell == ("hybrid", 0.3, 0.25)
    assert (why["gain"], why["se"]) == pytest.approx((0.02, 0.014), abs=1e-4)
    # two gained, one lost: gain 0.01 < SE sqrt(0.03 − 0.01²)/10 = 0.0173
    cell, why = choose_cell(_outcomes(dense, [False] + [True] * 89 + [True, True] + [False] * 8))
    assert cell == ("dense", None, 0.05)
    assert (why["gain"], why["se"]) == pytest.approx((0.01, 0.01729), abs=1e-4)
    assert choose_cell({"cells": {("dense", None, 0.05): {"ok": np.array(dense, dtype=bool)}}})[0] == ("dense", None, 0.05)


S1 = np.array([0.50, 0.60, 0.70, 0.80, 0.90, 0.91, 0.92, 0.93, 0.94, 0.95])
SCORE = np.array([0.90, 0.30, 0.80, 0.80, 0.80, 0.80, 0.80, 0.80, 0.80, 0.80])
OK = np.ones(10, dtype=bool)


def test_gate_thresholds_split_the_budget_between_s_min_and_t():
    # budget 0.1 = one right answer of ten: shares 0.25 and 0.5 (the default) leave it all to t,
    # share 1 spends it on s_min
    assert gate_thresholds(SCORE, S1, OK, 0.1, 0.25) == (0.5, 0.8)
    assert gate_thresholds(SCORE, S1, OK, 0.1) == gate_thresholds(SCORE, S1, OK, 0.1, 0.5) == (0.5, 0.8)
    assert gate_thresholds(SCORE, S1, OK, 0.1, 1.0) == (0.6, 0.3)
    assert calibrate_rules(SCORE, S1, OK, 0.1) == {"score": {"threshold": 0.8},
                                                   "gated": {"min_similarity": 0.5, "threshold": 0.8}}
    assert refused(SCORE, S1, 0.6, 0.3).tolist() == [True] + [False] * 9


def test_a_calibrated_clustered_kb_refuses_a_far_query_and_keeps_in_scope_ones():
    rng = np.random.default_rng(0)
    centres = np.eye(16, dtype=np.float32)[:4]  # (4, 16): four labels on four axes
    xb = np.repeat(centres, 40, axis=0) + 0.15 * rng.normal(size=(160, 16)).astype(np.float32)  # (160, 16)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    labels = [f"l{i // 40}" for i in range(160)]
    rec = calibrate_loo(xb, labels, [""] * 160, None, k=5, candidates=20)
    xq = np.concatenate([centres + 0.15 * rng.normal(size=(4, 16)).astype(np.float32),
                         np.eye(16, dtype=np.float32)[8:9]])  # (5, 16): one near each centre, one far
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    label_ids = np.repeat(np.arange(4), 40)
    verdicts, tops = [], []
    for q in xq:
        d = (xb @ q).astype(np.float64)
        (top, score), = query_votes(d, None, np.arange(160), label_ids, 4, [("dense", None, 0.05)], k=5,
                                    candidates=20).values()
        verdicts.append(bool(refused([score], [d.max()], rec["min_similarity"], rec["abstain_threshold_gated"])[0]))
        tops.append(top)
    assert verdicts == [False, False, False, False, True]
    assert tops[:4] == [0, 1, 2, 3]


def test_a_labelled_bundle_is_calibrated_at_build_and_abstains_out_of_the_box(engine, sample_bundle):
    cal = sample_bundle.manifest.raw["calibration"]
    assert cal["method"].startswith("leave-one-out")
    assert cal["leave_one_out"]["n"] == sum(c.get("label") is not None for c in sample_bundle.chunks)
    assert 0.0 < cal["min_similarity"] < 1.0 and cal["abstain_threshold_gated"] is not None
    lam, tau = cal["retrieval_defaults"]["hybrid"]["lexical_weight"], cal["retrieval_defaults"]["hybrid"]["temperature"]
    ood, ind = engine.infer(["How long should I boil an egg for a soft yolk?",
                             "Can I bring my dog on the Coral Line ferry to Brindlewick?"], InferParams())
    assert (ood.diagnostics.lexical_weight, ood.diagnostics.temperature) == (lam, tau)
    s1 = ood.diagnostics.nearest_similarity
    assert ood.abstained is True and ood.prediction is None
    assert ood.abstain_reason == f"nearest KB chunk similarity {s1:.3f} < {cal['min_similarity']:.3f} (out of domain)"
    assert ind.abstained is False and ind.prediction == "pets_and_animals"
    own = engine.infer(["How long should I boil an egg for a soft yolk?"], InferParams(lexical_weight=0.9,
                                                                                    temperature=0.5))[0]
    assert (own.diagnostics.lexical_weight, own.diagnostics.temperature) == (0.9, 0.5)  # a request's own win
