"""softknn eval: metric functions against hand-computed values, and the command end to end."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from softknn.evaluation.cli import calibrate_command, eval_command
from softknn.evaluation.holdout import holdout_split
from softknn.evaluation.metrics import (
    abstain_point,
    auroc,
    calibrate_rules,
    choose_threshold,
    classification_metrics,
    gated_scores,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    retrieval_metrics,
)
from softknn.evaluation.run import Strategy, _fused, read_queries, rules_from_calibration
from softknn.index_builder.reader import Document, Fields
from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle, write_calibration
from softknn.storage.layout import verify_bundle

SAMPLE = Path(__file__).resolve().parents[2] / "softknn" / "sample_kb"


def _app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    app.command("eval")(eval_command)
    app.command("calibrate")(calibrate_command)
    return app


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- metrics, by hand ---------------------------------------------------------------------------
def test_ranking_metrics_equal_hand_computed_values():
    ranked, gold = ["a", "b", "c", "d"], {"b", "d"}
    assert [recall_at_k(ranked, gold, k) for k in (1, 2, 3, 4)] == [0.0, 0.5, 0.5, 1.0]
    # DCG = 1/log2(3) + 1/log2(5); ideal = 1/log2(2) + 1/log2(3)
    assert ndcg_at_k(ranked, gold, 10) == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3)), abs=1e-12)
    assert ndcg_at_k(ranked, gold, 1) == 0.0
    assert mrr_at_k(ranked, gold, 10) == 0.5
    assert mrr_at_k(ranked, gold, 1) == 0.0
    assert ndcg_at_k(["x", "b"], {"b"}, 10) == pytest.approx(1 / math.log2(3), abs=1e-12)


def test_retrieval_metrics_average_over_queries_with_gold_only():
    m = retrieval_metrics([["a", "b"], ["c", "a"], ["z"]], [["a"], ["a", "q"], []], ks=(1, 2), depth=10)
    assert m["n"] == 2
    assert m["recall@1"] == 0.5  # (1 + 0) / 2
    assert m["recall@2"] == 0.75  # (1 + 0.5) / 2
    assert m["mrr@10"] == 0.75  # (1 + 1/2) / 2
    assert m["ndcg@10"] == pytest.approx((1 + (1 / math.log2(3)) / (1 + 1 / math.log2(3))) / 2, abs=1e-12)


def test_accuracy_and_macro_f1_equal_hand_computed_values():
    m = classification_metrics(["a", "a", "b", "c"], ["a", "b", "b", None])
    # a: tp 1 fn 1 → 2/3; b: tp 1 fp 1 → 2/3; c: fn 1 → 0; an abstention is wrong, not a class
    assert m == {"n": 4, "accuracy": 0.5, "macro_f1": pytest.approx(4 / 9, abs=1e-12)}


def test_threshold_is_the_largest_whose_accuracy_loss_meets_the_target():
    scores, correct = [0.9, 0.8, 0.6, 0.4], [True, False, True, True]
    assert choose_threshold(scores, correct, 0.0) == 0.4  # t = 0.6 already rejects a right answer
    assert choose_threshold(scores, correct, 0.25) == 0.6  # t = 0.8 would give up two (loss 0.5)
    assert abstain_point(scores, correct, 0.6) == {
        "threshold": 0.6, "rejection_rate": 0.25, "answered_accuracy": pytest.approx(2 / 3), "accuracy_loss": 0.25}
    assert auroc([0.9, 0.8], [0.85, 0.1]) == 0.75
    assert auroc([0.5], [0.5]) == 0.5


def test_gated_rule_spends_half_the_budget_on_the_similarity_gate():
    scores = [0.9, 0.9, 0.5, 0.8, 0.7]
    sims = [0.9, 0.4, 0.8, 0.7, 0.6]
    correct = [True, True, True, False, True]
    # s_min: loss ≤ 0.1 allows no right answer lost → s_min = 0.4 (the lowest correct similarity)
    # then t: loss ≤ 0.2 allows one → t = 0.7 (rejects the 0.5 one)
    r = calibrate_rules(scores, sims, correct, 0.2)
    assert r == {"score": {"threshold": 0.7}, "gated": {"min_similarity": 0.4, "threshold": 0.7}}
    assert gated_scores(scores, sims, 0.65).tolist() == [0.9, -1.0, 0.5, 0.8, -1.0]


def test_holdout_is_stratified_and_leaves_every_label_in_the_kb():
    docs = [Document(f"d{i}", f"text {i}", "x" if i < 10 else "y") for i in range(13)]
    docs.append(Document("u", "unlabelled", None))
    rest, held = holdout_split(docs, 0.2, seed=3)
    assert sorted(d.label for d in held) == ["x", "x", "y"]  # round(0.2·10) = 2, and ≥ 1 of 3
    assert {d.doc_id for d in rest} | {d.doc_id for d in held} == {d.doc_id for d in docs}
    assert "u" in {d.doc_id for d in rest}
    assert holdout_split(docs, 0.2, seed=3)[1] == held  # seeded


def test_query_gold_ids_from_a_list_one_id_or_a_csv_json_cell(tmp_path):
    _jsonl(tmp_path / "q.jsonl", [{"id": "1", "text": "a", "gold": ["x", "y"]}, {"id": "2", "text": "b", "gold": "z"}])
    assert [q.gold for q in read_queries(tmp_path / "q.jsonl", Fields(), "gold")] == [["x", "y"], ["z"]]
    (tmp_path / "q.csv").write_text('qid,question,cat,gold\n7,hello,c1,"[""p1"", ""p2""]"\n')
    [q] = read_queries(tmp_path / "q.csv", Fields("qid", "question", "cat"), "gold")
    assert (q.id, q.text, q.label, q.gold) == ("7", "hello", "c1", ["p1", "p2"])


# --- the command end to end -------------------------------------------------------------------
TINY_KB = [
    {"id": "k1", "text": "The harbour office opens at eight in the morning on weekdays.", "label": "hours"},
    {"id": "k2", "text": "Dogs must stay on a lead on the passenger deck at all times.", "label": "pets"},
    {"id": "k3", "text": "A single adult ticket to the outer islands costs twelve dollars.", "label": "fares"},
]


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, encoder) -> Path:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    root = tmp_path_factory.mktemp("tiny")
    out = root / "bundle"
    build_bundle(_jsonl(root / "kb.jsonl", TINY_KB), out, BuildConfig(), encoder, progress=False)
    return out


def test_eval_report_equals_the_hand_computable_case(tiny_bundle, tmp_path):
    # Each query is a KB text verbatim, so its own record is the nearest (s = 1) and, at τ = 0.01,
    # holds all w_db: every prediction is that record's label and it ranks first.
    q = _jsonl(tmp_path / "q.jsonl", [
        {"id": "q1", "text": TINY_KB[0]["text"], "label": "hours", "gold_ids": ["k1"]},
        {"id": "q2", "text": TINY_KB[1]["text"], "label": "fares", "gold_ids": ["nowhere"]},  # wrong on purpose
        {"id": "q3", "text": TINY_KB[2]["text"], "label": "fares", "gold_ids": ["k3", "nowhere"]},
    ])
    out = tmp_path / "report"
    r = CliRunner().invoke(_app(), ["eval", str(tiny_bundle), str(q), "--out", str(out), "--k", "2",
                                    "--temperature", "0.01", "--threshold", "0.5", "--no-progress"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    for name in ("softknn", "baseline_1nn", "baseline_knn"):
        m = rep["classification"][name]
        assert m["accuracy"] == pytest.approx(2 / 3)
        # hours 1/1/0 → F1 1; pets: fp 1 → 0; fares: tp 1 fn 1 → 2/3
        assert m["macro_f1"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    ideal2 = 1 + 1 / math.log2(3)
    for name in ("softknn", "baseline"):
        ev = rep["evidence"][name]
        assert ev["n"] == 3
        assert ev["recall@1"] == pytest.approx((1 + 0 + 0.5) / 3)
        assert ev["mrr@10"] == pytest.approx((1 + 0 + 1) / 3)
        assert ev["ndcg@10"] == pytest.approx((1 + 0 + 1 / ideal2) / 3)
    assert rep["evidence"]["softknn"]["recall@5"] == pytest.approx((1 + 0 + 0.5) / 3)  # k3's pair never reaches 1
    assert rep["evidence"]["curves"]["baseline"][0] == {"k": 1, "recall": pytest.approx(0.5)}
    a = rep["classification"]["abstain"]["softknn"]["score"]
    assert (a["threshold"], a["rejection_rate"], a["accuracy_loss"]) == (0.5, 0.0, 0.0)
    assert (out / "abstain.png").stat().st_size > 0 and (out / "evidence.png").stat().st_size > 0
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3


def test_eval_on_a_sample_slice_matches_its_own_predictions(sample_bundle_path, tmp_path):
    out = tmp_path / "report"
    r = CliRunner().invoke(_app(), [
        "eval", str(sample_bundle_path), str(SAMPLE / "queries.jsonl"), "--ood", str(SAMPLE / "ood_queries.jsonl"),
        "--out", str(out), "--limit", "12", "--k", "10", "--threshold", "0.6", "--batch-size", "8", "--no-progress"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert rep["classification"]["n"] == len(preds) == 12
    acc = np.mean([p["softknn"]["prediction"] == p["label"] for p in preds])
    assert rep["classification"]["softknn"]["accuracy"] == pytest.approx(acc)
    rej = np.mean([p["softknn"]["score"] < 0.6 for p in preds])
    assert rep["classification"]["abstain"]["softknn"]["score"]["rejection_rate"] == pytest.approx(rej)
    assert rep["classification"]["abstain"]["n_ood"] == 20
    assert rep["evidence"]["softknn"]["recall@10"] == pytest.approx(
        retrieval_metrics([p["softknn"]["ranked"] for p in preds], [p["gold"] for p in preds])["recall@10"])
    # the default is hybrid (the bundle has a lexical index); dense, lexical and hybrid ran side by side
    assert rep["softknn_params"]["retrieval"] == "hybrid" and set(rep["retrieval"]) == {"dense", "lexical", "hybrid"}
    assert rep["retrieval"]["hybrid"]["evidence"] == rep["evidence"]["softknn"]
    assert rep["retrieval"]["hybrid"]["classification"] == rep["classification"]["softknn"]
    # fixed mixing ranks evidence by (1 − α)·w_db, so dense retrieval orders R as the baseline does
    assert rep["retrieval"]["dense"]["evidence"] == rep["evidence"]["baseline"]
    assert (out / "abstain.png").is_file() and (out / "summary.json").is_file() and (out / "retrieval.png").is_file()


def test_shared_plain_pass_reads_out_what_engine_infer_returns(engine):
    texts = ["can I bring my dog?", "what does a day pass cost for a child travelling alone on the ferry?"]
    p = InferParams(k=6, evidence=6)
    want = engine.infer(texts, p)
    batch = engine.encoder.tokenize(texts, truncate=True)
    plain = engine.encoder.forward_plain(batch, keep_hidden=True, capture_layer=engine.layer)  # as Engine._infer
    got = _fused(engine, batch, plain, plain.embedding.float().cpu().numpy(), p, Strategy())
    for g, w in zip(got, want, strict=True):
        assert np.abs(np.array(g.embedding) - np.array(w.embedding)).max() <= 1e-6
        assert [e.chunk_id for e in g.evidence] == [e.chunk_id for e in w.evidence]
        assert g.label_scores == pytest.approx(w.label_scores)


def test_calibration_is_stored_in_a_bundle_that_still_verifies(tiny_bundle, tmp_path, encoder):
    b = tmp_path / "b"
    shutil.copytree(tiny_bundle, b)
    before = verify_bundle(b)["version_id"]
    m = write_calibration(b, {"abstain_threshold": 0.99, "target_accuracy_loss": 0.01})
    assert verify_bundle(b)["version_id"] == m["version_id"] != before
    res = Engine(encoder, load_bundle(b)).infer(["when does the harbour office open?"], InferParams(k=3, temperature=1.0))
    assert res[0].abstained and res[0].prediction is None  # three labels at τ = 1: top score < 0.99


def test_calibrate_command_splits_the_kb_and_writes_the_threshold(tmp_path, encoder):
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    rows = [json.loads(line) for line in (SAMPLE / "kb" / "kb.jsonl").read_text().splitlines()]
    by_label: dict[str, list] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    kb = _jsonl(tmp_path / "kb.jsonl", [r for label in sorted(by_label)[:3] for r in by_label[label][:8]])
    build_bundle(kb, tmp_path / "bundle", BuildConfig(), encoder, progress=False)
    r = CliRunner().invoke(_app(), ["calibrate", str(tmp_path / "bundle"), str(kb), "--work", str(tmp_path / "work"),
                                    "--fraction", "0.25", "--target-loss", "0.0", "--min-validation", "6",
                                    "--no-progress"])
    assert r.exit_code == 0, r.output
    cal = verify_bundle(tmp_path / "bundle")["calibration"]
    assert cal["validation"]["n"] == 6 == cal["validation"]["min_n"]  # 2 of 8 in each of 3 labels
    assert cal["validation"]["score_rule"]["accuracy_loss"] == 0.0  # the target
    assert cal["validation"]["gated_rule"]["accuracy_loss"] == 0.0
    assert cal["abstain_threshold"] > 0.0
    rules = rules_from_calibration(cal)
    assert rules["softknn"]["score"] == {"threshold": cal["abstain_threshold"]}
    assert rules["softknn"]["gated"] == {"threshold": cal["abstain_threshold_gated"], "min_similarity": cal["min_similarity"]}
    held = [json.loads(line)["id"] for line in (tmp_path / "work" / "heldout.jsonl").read_text().splitlines()]
    rest = [json.loads(line)["id"] for line in (tmp_path / "work" / "rest.jsonl").read_text().splitlines()]
    assert len(held) == 6 and len(rest) == 18 and not set(held) & set(rest)
