"""Grounded refusal (softknn.generate.refusal): the threshold from given pseudo-question scores, s₁ of the
held-out sentences against a brute force over the stand-ins, and the verdict of each case."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.generate.refusal import (
    REFUSAL_QUANTILE,
    SIGNAL,
    calibrate_refusal,
    judge,
    pseudo_nearest,
    refusal_threshold,
)


def test_the_threshold_leaves_at_most_the_quantile_of_the_scores_below_it():
    s = np.random.default_rng(0).permutation(np.arange(100) / 100)
    assert refusal_threshold(s, 0.03) == 0.03 and int((s < 0.03).sum()) == 3  # ⌊0.03·100⌋ = 3 below
    assert refusal_threshold(s, 0.1) == 0.1
    assert refusal_threshold([0.4, 0.2, 0.9, 0.7], 0.03) == 0.2  # ⌊0.12⌋ = 0: the smallest, none refused
    assert refusal_threshold([0.4, 0.2, 0.9, 0.7, 0.5, 0.6, 0.3, 0.8], 0.25) == 0.4  # ⌊2⌋ below: 0.2, 0.3
    with pytest.raises(ValueError, match="at least one score"):
        refusal_threshold([], 0.03)


def test_the_record_from_given_pseudo_question_scores():
    s1 = np.array([0.52, 0.31, 0.77, 0.45, 0.60] * 8, dtype=np.float32)  # 40 questions; ⌊0.03·40⌋ = 1 below t
    pq = [(i, f"q{i}", f"s{i}") for i in range(40)]
    rec = calibrate_refusal(np.zeros((40, 3), np.float32), [""] * 40, None, outcomes=(s1, pq))  # type: ignore[arg-type]
    assert rec["signal"] == SIGNAL and rec["quantile"] == REFUSAL_QUANTILE and rec["questions"] == 40
    assert rec["threshold"] == pytest.approx(0.31)  # the 2nd smallest: the eight 0.31s tie, none below
    assert rec["refused_questions"] == 0.0
    few = calibrate_refusal(np.zeros((5, 3), np.float32), [""] * 5, None, outcomes=(s1[:5], pq[:5]))  # type: ignore[arg-type]
    assert few["threshold"] is None and few["questions"] == 5 and "never refuses" in few["note"]


def test_held_out_sentences_are_scored_against_the_stand_ins_without_verbatim_copies():
    """s₁ of each held-out sentence = the brute-force max over the KB with every stand-in in place and
    the other chunks that hold the sentence verbatim left out."""
    texts = [
        "The ferry leaves at noon every day. Tickets are sold at the quay office.",
        "Dogs travel free on a lead. Cats must stay in a closed basket on deck.",
        "Bicycles cost two dollars each way. Racks are at the stern of the vessel.",
        "Dogs travel free on a lead. Cats must stay in a closed basket on deck. Lockers hold bags.",
        "Lost property is kept for thirty days. Ask at the purser's desk on board.",
    ]
    vocab: dict[str, np.ndarray] = {}

    def embed(batch: list[str]) -> np.ndarray:  # a bag of seeded random word vectors, normalised
        out = []
        for t in batch:
            v = sum(vocab.setdefault(w, np.random.default_rng(len(vocab)).normal(size=16)) for w in t.lower().split())
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)

    xb = embed(texts)
    s1, pq = pseudo_nearest(xb, texts, embed, max_questions=10, seed=1)
    assert len(pq) == 5 and [c for c, _, _ in pq] == [0, 1, 2, 3, 4]
    kb, kb_texts = xb.copy(), list(texts)
    for c, _, s in pq:
        kb[c], kb_texts[c] = embed([s])[0], s
    for j, (c, q, _) in enumerate(pq):
        d = kb @ embed([q])[0]
        want = max(d[i] for i in range(len(texts)) if i == c or q not in kb_texts[i])
        assert s1[j] == pytest.approx(want, abs=1e-6)
    # the sentence held out of chunk 1 is verbatim in chunk 3's stand-in, the nearest row to it: left out
    q1 = pq[1][1]
    assert q1 == "Dogs travel free on a lead." and q1 in kb_texts[3]
    assert s1[1] < float(kb[3] @ embed([q1])[0])


@pytest.mark.parametrize("nearest,record,refuse,want", [
    (0.62, {"threshold": 0.5}, True, (True, False)),
    (0.50, {"threshold": 0.5}, True, (True, False)),  # at the threshold: grounded
    (0.31, {"threshold": 0.5}, True, (False, True)),
    (0.31, {"threshold": 0.5}, False, (False, False)),  # refuse false: the verdict, no refusal
    (0.31, None, True, (None, False)),  # a bundle built before the record
    (0.31, {"threshold": None, "note": "fewer than 20 chunks"}, True, (None, False)),
    (None, {"threshold": 0.5}, True, (None, False)),  # no retrieval (use_kb false)
])
def test_the_verdict(nearest, record, refuse, want):
    g = judge(nearest, record, refuse)
    assert (g.grounded, g.refused) == want
    assert g.value == nearest and g.threshold == (record or {}).get("threshold")
    if record is None or record.get("threshold") is None:
        assert g.note.endswith("never refuses") or g.note.startswith("no retrieval")
    elif want[0] is False:
        assert g.note == f"nearest chunk similarity {nearest:.3f} < 0.500: " + (
            "refused" if refuse else "answered anyway (refuse false)")
