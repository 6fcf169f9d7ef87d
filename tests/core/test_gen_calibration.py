"""Generation defaults chosen per KB from its own fill-in-the-blank questions (softknn.generate.calibration):
the questions, the scorer, the choice rule, the whole calibration with a stand-in answerer, and a real
build whose manifest names k and β and whose engine serves them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from softknn.generate import calibration as cal
from softknn.generate.calibration import (
    BLANK,
    answer_contains,
    blank_question,
    blank_questions,
    calibrate_generation,
    choose_setting,
)


def test_a_blank_removes_a_number_with_its_unit_and_the_stand_in_drops_its_sentence():
    text = ("Every member firm keeps a register of complaints. The firm must reply within 30 days of receipt. "
            "Records are kept at the head office.")
    q = blank_question(text, np.random.default_rng(0))
    assert q is not None
    assert (q.question, q.answer) == (f"Fill in the blank: The firm must reply within {BLANK} of receipt.", "30 days")
    assert q.standin == "Every member firm keeps a register of complaints. Records are kept at the head office."


def test_a_name_inside_a_sentence_can_be_the_blank_and_a_single_sentence_makes_none():
    text = ("Each report goes to the Financial Services Authority within the year. Copies are kept on file "
            "for inspection.")
    q = blank_question(text, np.random.default_rng(0))
    assert q is not None and q.answer == "Financial Services Authority"
    assert blank_question("The firm must reply within 30 days of receipt.", np.random.default_rng(0)) is None
    assert blank_question("Short one. And another short.", np.random.default_rng(0)) is None


def test_blank_questions_are_one_per_chunk_seeded_and_in_row_order():
    texts = [f"Rule {i} applies to every firm in the market. A fee of {10 + i} dollars is due each year." for i in range(30)]
    a, b = blank_questions(texts, 12, seed=3), blank_questions(texts, 12, seed=3)
    assert a == b and len(a) == 12 and [q.row for q in a] == sorted({q.row for q in a})
    assert all(q.answer in texts[q.row] and q.answer not in q.question for q in a)


@pytest.mark.parametrize("answer,ref,want", [
    ("The fee is $9.50 a day.", "9.50", True),
    ("within 30 days", "30 days", True),
    ("It is 130 days.", "30 days", False),
    ("version 9.5", "9", False),
    ("The Financial Services Authority.", "financial services authority", True),
    ("", "x", False),
])
def test_an_answer_holds_the_reference_on_word_boundaries(answer, ref, want):
    assert answer_contains(answer, ref) is want


def test_the_smallest_setting_within_two_standard_errors_of_the_best_is_chosen():
    n = 50
    best = np.ones(n)
    near = np.ones(n)
    near[:2] = 0  # 2 of 50 worse: within 2 SE of the best (SE of the paired difference ≈ 0.028)
    far = np.zeros(n)
    chosen, top, se = choose_setting(np.stack([far, near, best]))
    assert (chosen, top) == (1, 2)
    assert se[2] == 0.0 and se[0] == pytest.approx(0.0, abs=1e-12)  # all-zero differences: std 0
    near[:10] = 0  # 10 of 50 worse: 0.2 below, SE 0.057 → outside
    assert choose_setting(np.stack([far, near, best]))[0] == 2


def test_calibration_chooses_by_what_the_answers_score(encoder, sample_bundle):
    """A stand-in answerer right only with k = 2 and β ≥ 1: the choice is (2, 1.0), the grid and rule are
    recorded, and each question's chunk was searched for without its blanked sentence."""
    texts = [c["text"] for c in sample_bundle.chunks]
    xb = np.load(Path(sample_bundle.path) / "embeddings.npy")
    seen = []

    def answer(batch):
        seen.extend(batch)
        return [q.answer if (len(rows) == 2 and beta >= 1.0) else "no idea" for q, rows, w, beta in batch]

    from softknn.index_builder.pipeline import embed_texts

    rec = calibrate_generation(texts, xb, lambda t: embed_texts(encoder, t), sample_bundle.lexical, answer,
                               lexical_weight=0.6, temperature=0.05, ks=(1, 2, 4), priors=(0.0, 1.0, 4.0),
                               max_questions=30, min_questions=20)
    assert (rec["k"], rec["prior"]) == (2, 1.0) and rec["questions"] == 30
    # β over k 2 and 4 together: β 1 and 4 both 30 right (k 2), the weaker of them, at every k
    assert rec["prior_by_k"] == {"1": 1.0, "2": 1.0, "4": 1.0}
    assert [(g["k"], g["prior"]) for g in rec["grid"]] == [(k, b) for k in (1, 2, 4) for b in (0.0, 1.0, 4.0)]
    assert [g["accuracy"] for g in rec["grid"]] == [0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert "within 2 standard errors" in rec["rule"] and rec["method"] == cal.METHOD
    assert len(seen) == 30 * 9 and all(abs(float(np.sum(w)) - 1.0) < 1e-5 for _, _, w, _ in seen)
    assert rec["found_in_top"]["1"] <= rec["found_in_top"]["2"] <= rec["found_in_top"]["4"] and 0 < rec["found_in_top"]["4"] <= 1


def _calibrated(encoder, sample_bundle, right) -> dict:
    """calibrate_generation over 30 questions of the sample KB, k 1 / 2 / 4 and β 0 / 1 / 4, with an answerer
    right where right(i, k, β) says (i: the question's order)."""
    texts = [c["text"] for c in sample_bundle.chunks]
    xb = np.load(Path(sample_bundle.path) / "embeddings.npy")
    order: dict[str, int] = {}

    def answer(batch):
        out = []
        for q, rows, _w, beta in batch:
            i = order.setdefault(q.question, len(order))
            out.append(q.answer if right(i, len(rows), beta) else "no idea")
        return out

    from softknn.index_builder.pipeline import embed_texts

    return calibrate_generation(texts, xb, lambda t: embed_texts(encoder, t), sample_bundle.lexical, answer,
                                lexical_weight=0.6, temperature=0.05, ks=(1, 2, 4), priors=(0.0, 1.0, 4.0),
                                max_questions=30, min_questions=20)


def test_beta_is_the_best_scoring_one_not_the_weakest_within_the_margin(encoder, sample_bundle):
    """An answerer right on 3 of 30 questions at k 4 with β 4 and on 1 of them with β 0, never at k 1 or 2:
    k 1 (0 of 30, within 2 standard errors ≈ 0.11 of the best) stays the chosen k, and the prior that scored
    best is recorded (β 4), not the weakest within the margin (β 0, 2 of 30 behind)."""
    rec = _calibrated(encoder, sample_bundle, lambda i, k, b: k == 4 and ((b == 4.0 and i < 3) or (b == 0.0 and i < 1)))
    assert [g["accuracy"] for g in rec["grid"]] == [0, 0, 0, 0, 0, 0, round(1 / 30, 4), 0, 0.1]
    assert rec["best"] == {"k": 4, "prior": 4.0, "accuracy": 0.1}
    assert (rec["k"], rec["prior"]) == (1, 4.0)  # 0 of 30 at k 1 is within 2 SE of 3 of 30
    assert rec["prior_by_k"] == {"1": 4.0, "2": 4.0, "4": 4.0}
    assert rec["rule"].endswith("β: the most right answers over every k ≥ 2 together (ties: the weaker)")


def test_beta_is_pooled_over_every_k_so_a_tie_at_one_k_does_not_decide_it(encoder, sample_bundle):
    """At k 4 every β is right on the same one question (a tie, which per k went to β 0); at k 2 β 1 is right
    on 3 and the others on 1: over k 2 and 4 together β 1 leads (4 against 2), at every k."""
    rec = _calibrated(encoder, sample_bundle, lambda i, k, b: (k == 4 and i < 1) or (k == 2 and i < (3 if b == 1.0 else 1)))
    assert [g["accuracy"] for g in rec["grid"]][3:] == [round(x / 30, 4) for x in (1, 3, 1, 1, 1, 1)]
    assert rec["prior"] == 1.0 and rec["prior_by_k"] == {"1": 1.0, "2": 1.0, "4": 1.0}


def test_too_few_questions_leave_the_fixed_defaults(encoder):
    rec = calibrate_generation(["One sentence only here."] * 5, np.zeros((5, 384), dtype=np.float32),
                               lambda t: np.zeros((len(t), 384), dtype=np.float32), None, lambda b: [],
                               lexical_weight=0.6, temperature=0.05)
    assert "k" not in rec and rec["questions"] == 0 and "fixed defaults stay" in rec["note"]


def test_a_generator_build_records_its_choice_and_serves_it(tmp_path, sample_kb, encoder, monkeypatch):
    """The real path: the builder's generator pass, then calibration through the batching decode loop
    (a 2 × 2 grid to keep it short); the manifest names k, β, the grid and the rule; a request without
    k and prior gets them, one with its own keeps its own."""
    from softknn.generate.engine import GenEngine, GenParams
    from softknn.generate.model import Generator
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.retrieval.search import Retriever
    from softknn.storage.bundle import load_bundle, verify_bundle

    monkeypatch.setattr(cal, "GEN_KS", (1, 2))
    monkeypatch.setattr(cal, "GEN_PRIORS", (0.0, 4.0))
    monkeypatch.setattr(cal, "GEN_QUESTIONS", 24)
    kb = tmp_path / "kb.jsonl"
    kb.write_text("\n".join((Path(sample_kb) / "kb.jsonl").read_text(encoding="utf-8").splitlines()[:60]) + "\n")
    gen = Generator.load()
    build_bundle(kb, tmp_path / "b", BuildConfig(generator_layers="all", generator_memory="q4"), encoder,
                 progress=False, generator=gen)
    g = verify_bundle(tmp_path / "b")["generator"]
    c = g["calibration"]
    assert c["k"] in (1, 2) and c["prior"] in (0.0, 4.0) and c["questions"] == 24
    assert [(x["k"], x["prior"]) for x in c["grid"]] == [(1, 0.0), (1, 4.0), (2, 0.0), (2, 4.0)]
    assert c["rule"].startswith("k: the smallest whose accuracy") and json.dumps(c)
    ge = GenEngine(Retriever(load_bundle(tmp_path / "b")), encoder, gen)
    assert ge.defaults() == (c["k"], c["prior"], "calibrated")
    a = ge.answer(GenParams(max_tokens=2), messages=[{"role": "user", "content": "How much is a bicycle?"}])
    assert (a.diagnostics["k"], a.diagnostics["prior"], a.diagnostics["defaults"]) == (c["k"], c["prior"], "calibrated")
    own = ge.answer(GenParams(max_tokens=2, k=3, prior=0.5), messages=[{"role": "user", "content": "Bicycles?"}])
    assert (own.diagnostics["k"], own.diagnostics["prior"]) == (3, 0.5)
    assert c["prior_by_k"]["1"] == 0.0  # one chunk: every β is the same computation, the weakest is kept
    at_k = ge.answer(GenParams(max_tokens=2, k=3), messages=[{"role": "user", "content": "Bicycles?"}])
    assert (at_k.diagnostics["k"], at_k.diagnostics["prior"]) == (3, c["prior_by_k"]["2"])  # the grid's k ≤ 3
