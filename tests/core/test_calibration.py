"""Build-time calibration by leave-one-out: the grid against a plain loop, the record in
the manifest, and a labelled bundle that abstains out of the box."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.attention import knn_weights_row
from softknn.calibration import (
    GATE_SHARE_DEFAULT,
    calibrate_loo,
    choose_cell,
    choose_gate,
    gate_thresholds,
    loo_outcomes,
    query_votes,
    refused,
)
from softknn.engine import InferParams
from softknn.evidence import label_scores
from softknn.lexical import LexicalIndex
from softknn.retrieval import best, scores_reference

WORDS = "ferry dog refund ticket cabin storm harbour bike luggage wheelchair timetable cafe".split()


def _toy_kb(n: int = 60, seed: int = 3):
    rng = np.random.default_rng(seed)
    xb = rng.normal(size=(n, 16)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    labels = [None if i % 7 == 0 else f"l{i % 4}" for i in range(n)]
    texts = [" ".join(rng.choice(WORDS, size=5)) for _ in range(n)]
    return xb, labels, texts


@pytest.mark.parametrize("hold_out", ["chunk", "label"])
def test_leave_one_out_cells_equal_a_plain_loop(hold_out):
    xb, labels, texts = _toy_kb()
    lex = LexicalIndex.build(texts)
    k, m = 5, 10
    out = loo_outcomes(xb, labels, texts, lex, k=k, candidates=m, weights=(0.3, 0.6), temperatures=(0.1, 0.25),
                       hold_out=hold_out)
    rows = [i for i, x in enumerate(labels) if x is not None]
    assert out["rows"].tolist() == rows

    def others_of(c):  # "label": every chunk of c's label out, unlabelled chunks stay
        return np.array([j for j in range(len(xb)) if (j != c if hold_out == "chunk" else labels[j] != labels[c])])

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
    if hold_out == "label":
        assert not any(cell["ok"].any() for cell in out["cells"].values())  # the right label is never there


def test_loo_outcomes_computes_only_the_cells_asked_for():
    xb, labels, texts = _toy_kb()
    lex = LexicalIndex.build(texts)
    full = loo_outcomes(xb, labels, texts, lex, k=5, candidates=10, weights=(0.3,), temperatures=(0.25,))
    one = loo_outcomes(xb, labels, texts, lex, k=5, candidates=10, cells=[("hybrid", 0.3, 0.25)])
    assert list(one["cells"]) == [("hybrid", 0.3, 0.25)]
    assert one["cells"][("hybrid", 0.3, 0.25)]["score"].tolist() == full["cells"][("hybrid", 0.3, 0.25)]["score"].tolist()


def test_calibration_serves_the_cell_choose_cell_picks_and_spends_the_margin_of_the_budget():
    xb, labels, texts = _toy_kb(120)
    rec = calibrate_loo(xb, labels, texts, LexicalIndex.build(texts), k=5, candidates=20)
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
    assert rec["gate"]["share"] in (0.25, 0.5, 0.75, 1.0)
    assert rec["gate"]["pseudo_oos"]["n"] == sum(x is not None for x in labels)  # under OOS_QUERIES: every one
    row = next(r for r in rec["gate"]["shares"] if r["share"] == rec["gate"]["share"])
    assert (row["min_similarity"], row["threshold"]) == (rec["min_similarity"], rec["abstain_threshold_gated"])
    assert row["pseudo_oos_refusal"] == max(r["pseudo_oos_refusal"] for r in rec["gate"]["shares"])
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
    # budget 0.1 = one right answer of ten: share 0.25 leaves it all to t, share 1 spends it on s_min
    assert gate_thresholds(SCORE, S1, OK, 0.1, 0.25) == (0.5, 0.8)
    assert gate_thresholds(SCORE, S1, OK, 0.1, 1.0) == (0.6, 0.3)
    assert refused(SCORE, S1, 0.6, 0.3).tolist() == [True] + [False] * 9


def test_choose_gate_takes_the_share_that_refuses_most_pseudo_out_of_scope_queries():
    oos = {"s1": np.array([0.55, 0.58, 0.95]), "score": np.array([0.9, 0.9, 0.5])}
    share, table = choose_gate(SCORE, S1, OK, 0.1, oos, shares=(0.25, 1.0))
    assert share == 1.0
    assert [(r["min_similarity"], r["threshold"], r["pseudo_oos_refusal"]) for r in table] == [
        (0.5, 0.8, pytest.approx(1 / 3)), (0.6, 0.3, pytest.approx(2 / 3))]
    assert [r["accuracy_loss"] for r in table] == pytest.approx([0.1, 0.1])
    tie = {"s1": np.array([0.95]), "score": np.array([0.1])}  # both refuse it: the larger share
    assert choose_gate(SCORE, S1, OK, 0.1, tie, shares=(0.25, 1.0))[0] == 1.0
    assert choose_gate(SCORE, S1, OK, 0.1, None, shares=(0.25, 1.0))[0] == GATE_SHARE_DEFAULT


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
