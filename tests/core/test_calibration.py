"""Build-time calibration by leave-one-out: the grid against a plain loop, the record in
the manifest, and a labelled bundle that abstains out of the box."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.attention import knn_weights_row
from softknn.calibration import calibrate_loo, loo_outcomes
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


def test_leave_one_out_cells_equal_a_plain_loop():
    xb, labels, texts = _toy_kb()
    lex = LexicalIndex.build(texts)
    k, m = 5, 10
    out = loo_outcomes(xb, labels, texts, lex, k=k, candidates=m, weights=(0.3, 0.6), temperatures=(0.1, 0.25))
    rows = [i for i, x in enumerate(labels) if x is not None]
    assert out["rows"].tolist() == rows
    for (mode, lam, tau), cell in out["cells"].items():
        want_ok, want_score = [], []
        for c in rows:
            others = np.array([j for j in range(len(xb)) if j != c])
            d = xb[others].astype(np.float64) @ xb[c].astype(np.float64)
            b = np.delete(lex.scores(lex.analyzer.terms(texts[c])), c)
            s = scores_reference(d, b, mode, lam or 0.0, m)
            S, I = best(s, others, k)
            w = knn_weights_row(S.astype(np.float32), tau)
            scores = label_scores([labels[j] for j in I], w.tolist())
            top, score = next(iter(scores.items()), (None, 0.0))
            want_ok.append(top == labels[c])
            want_score.append(score)
        assert cell["ok"].tolist() == want_ok, (mode, lam, tau)
        np.testing.assert_allclose(cell["score"], want_score, atol=1e-6)
    assert out["s1"] == pytest.approx([max(np.delete(xb @ xb[c], c)) for c in rows], abs=1e-6)


def test_calibration_picks_the_best_cell_and_spends_the_margin_of_the_budget():
    xb, labels, texts = _toy_kb(120)
    rec = calibrate_loo(xb, labels, texts, LexicalIndex.build(texts), k=5, candidates=20)
    grid = rec["leave_one_out"]["grid"]
    hybrid = [g for g in grid if g["retrieval"] == "hybrid"]
    assert len(hybrid) == 36 and rec["params"]["retrieval"] == "hybrid"
    top = max(g["accuracy"] for g in hybrid)
    chosen = rec["retrieval_defaults"]["hybrid"]
    assert {"lexical_weight": chosen["lexical_weight"], "temperature": chosen["temperature"]} in [
        {"lexical_weight": g["lexical_weight"], "temperature": g["temperature"]} for g in hybrid if g["accuracy"] == top]
    assert rec["leave_one_out"]["gated_rule"]["accuracy_loss"] <= 0.75 * 0.01 + 1e-12
    assert rec["leave_one_out"]["score_rule"]["accuracy_loss"] <= 0.75 * 0.01 + 1e-12
    dense_only = calibrate_loo(xb, labels, texts, None, k=5, candidates=20)
    assert dense_only["retrieval_defaults"] == {"dense": {"temperature": 0.05}}


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
