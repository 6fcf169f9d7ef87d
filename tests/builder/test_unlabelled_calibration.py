"""An unlabelled KB chooses its hybrid λ at build time from held-out sentences of its own chunks
(softknn.retrieval.calibration.calibrate_unlabelled): the rule on hand-made inputs, the record a build writes,
the default a request without lexical_weight gets from it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from softknn.retrieval.calibration import PSEUDO_WEIGHTS, calibrate_unlabelled, choose_weight, held_out, pseudo_queries
from softknn.retrieval.lexical import LexicalSpec


def test_the_rule_takes_the_smallest_weight_within_two_standard_errors_of_the_best():
    # 4 queries. Row 2 is best (mean 1). Row 0 trails by 1 on every query: SE 0, out. Row 1 trails
    # by 0.25 with paired differences (0, 0, 0, −1): SE = std/√4 = (√3/4)/2 = 0.2165, so 2 SE
    # = 0.433 ≥ 0.25: in, and the first in is chosen; at 0.5 SE (0.108 < 0.25) it is out.
    rr = np.array([[0.0, 0.0, 0.0, 0.0],
                   [1.0, 1.0, 1.0, 0.0],
                   [1.0, 1.0, 1.0, 1.0]])
    chosen, top, se = choose_weight(rr)
    assert (chosen, top) == (1, 2)
    assert se.tolist() == pytest.approx([0.0, np.sqrt(3) / 8, 0.0])
    assert choose_weight(rr, 0.5)[:2] == (2, 2)
    rr[0] = rr[2]  # equal means: the first is the best, and chosen
    assert choose_weight(rr)[:2] == (0, 0)


def test_a_sentence_is_held_out_of_a_chunk_of_two_or_more():
    rng = np.random.default_rng(0)
    q, rest = held_out("The ferry leaves at noon. Dogs travel free on deck. Bikes cost two pounds each.", rng)
    assert q in ("The ferry leaves at noon.", "Dogs travel free on deck.", "Bikes cost two pounds each.")
    assert q not in rest and len(rest.split()) == 10
    assert held_out("one two three four five six seven", rng) is None  # one sentence
    assert held_out("Too short. One two three.", rng) is None  # "Too short." has < 3 words
    assert [c for c, _, _ in pseudo_queries(["a b", "One two three. Four five six.", "x"] * 3, 10)] == [1, 4, 7]


def _lexical_kb(n: int = 30):
    """Chunk i: two sentences sharing one word no other chunk has; every embedding the same, so only
    BM25 can find a chunk."""
    words = [f"zq{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(n)]
    texts = [f"The {w} engine starts early. The {w} engine stops late." for w in words]
    xb = np.ones((n, 4), dtype=np.float32) / 2.0
    return xb, texts, lambda t: np.ones((len(t), 4), dtype=np.float32) / 2.0


def test_on_a_kb_only_bm25_can_search_the_smallest_lexical_weight_is_chosen():
    xb, texts, embed = _lexical_kb()
    rec = calibrate_unlabelled(xb, texts, LexicalSpec(), embed, candidates=10)
    pq = rec["pseudo_queries"]
    assert pq["n"] == 30 and rec["source"] == "pseudo-queries"
    grid = {g["lexical_weight"]: g for g in pq["grid"]}
    assert list(grid) == list(PSEUDO_WEIGHTS)
    # λ 0: every score ties, so the right chunk's rank is its row: MRR = (1 + 1/2 + … + 1/10) / 30
    assert grid[0.0]["mrr"] == pytest.approx(sum(1 / r for r in range(1, 11)) / 30, abs=1e-6)
    assert all(grid[w]["mrr"] == 1.0 for w in PSEUDO_WEIGHTS[1:])
    assert rec["retrieval_defaults"] == {"hybrid": {"lexical_weight": 0.1}}
    assert rec["abstain_threshold"] is None


def test_pseudo_queries_that_rarely_find_their_chunk_choose_dense():
    """Below min_mrr even the best λ's pseudo-queries cannot tell the λs apart: λ 0, said in a note."""
    xb, texts, embed = _lexical_kb()
    rec = calibrate_unlabelled(xb, texts, LexicalSpec(), embed, candidates=10, min_mrr=1.5)
    assert rec["retrieval_defaults"] == {"hybrid": {"lexical_weight": 0.0}}
    pq = rec["pseudo_queries"]
    assert pq["best_lexical_weight"] == 0.1
    assert pq["note"] == "the best pseudo-query MRR@10 1.000 is below 1.5: they cannot tell the λs apart, so dense"
    assert "dense (λ 0) when the best MRR is below 1.5" in pq["rule"]
    assert "note" not in calibrate_unlabelled(xb, texts, LexicalSpec(), embed, candidates=10)["pseudo_queries"]


def test_too_few_chunks_to_hold_a_sentence_out_keep_the_fixed_default():
    xb, texts, embed = _lexical_kb(10)
    rec = calibrate_unlabelled(xb, texts, LexicalSpec(), embed, candidates=10)
    assert rec["retrieval_defaults"] == {} and rec["pseudo_queries"]["n"] == 10
    assert "fixed default 0.6" in rec["pseudo_queries"]["note"]


TOPICS = [
    ("ferries", "The Coral Line ferry leaves Brindlewick harbour at nine. Dogs on a lead may travel on the open deck."),
    ("refunds", "A cancelled sailing is refunded in full within five days. Refunds go back to the card that paid."),
    ("bikes", "Bicycles travel in the racks on the car deck. Electric bikes must have their battery removed."),
    ("luggage", "Each passenger may bring two suitcases without charge. Oversized luggage is stored in the hold."),
    ("cafe", "The onboard cafe serves hot meals until an hour before arrival. Vegetarian dishes are marked green."),
    ("storms", "Sailings are cancelled when the wind exceeds force eight. Passengers are told by text message."),
    ("cabins", "Cabins with two berths can be booked on overnight crossings. Each cabin has its own shower."),
    ("access", "Wheelchair users board by the lift on the car deck. Crew assist anyone who asks at the ramp."),
]


@pytest.fixture(scope="module")
def unlabelled_bundle(tmp_path_factory, encoder):
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    tmp = tmp_path_factory.mktemp("unlabelled")
    kb = tmp / "kb.jsonl"
    with open(kb, "w", encoding="utf-8") as f:
        for r in range(3):
            for name, text in TOPICS:
                f.write(json.dumps({"id": f"{name}-{r}", "text": f"{text} Notice {r} for {name} is posted at the office."})
                        + "\n")
    out = tmp / "bundle"
    build_bundle(kb, out, BuildConfig(), encoder, progress=False)
    return out


def test_an_unlabelled_build_records_its_choice_and_a_request_without_lexical_weight_uses_it(unlabelled_bundle, encoder):
    from softknn.infer.engine import Engine, InferParams
    from softknn.storage.bundle import load_bundle
    from softknn.storage.layout import read_manifest

    cal = read_manifest(unlabelled_bundle)["calibration"]
    pq = cal["pseudo_queries"]
    assert cal["source"] == "pseudo-queries" and cal["method"].startswith("pseudo-queries")
    assert pq["n"] == 24 and [g["lexical_weight"] for g in pq["grid"]] == list(PSEUDO_WEIGHTS)
    lam = cal["retrieval_defaults"]["hybrid"]["lexical_weight"]
    assert lam in PSEUDO_WEIGHTS and lam != 0.6  # 0.6 would not tell the recorded λ from the fallback
    bundle = load_bundle(unlabelled_bundle, expected_fingerprint=encoder.info.fingerprint)
    assert bundle.manifest.calibration.abstain_threshold is None
    engine = Engine(encoder, bundle)
    own, given = engine.infer(["Can my dog come on the ferry?"], InferParams())[0], \
        engine.infer(["Can my dog come on the ferry?"], InferParams(lexical_weight=0.6))[0]
    assert (own.diagnostics.retrieval, own.diagnostics.lexical_weight, own.diagnostics.knn_temperature) == ("hybrid", lam, 0.25)
    assert given.diagnostics.lexical_weight == 0.6
    assert own.abstained is False


def test_a_kb_write_and_a_compaction_keep_the_lambda_the_build_chose(unlabelled_bundle, encoder, tmp_path):
    import shutil

    from softknn.index_builder.documents import BuilderDocuments
    from softknn.storage.layout import read_manifest
    from softknn.storage.writes import KBStore

    copy = tmp_path / "b"
    shutil.copytree(unlabelled_bundle, copy)
    built = read_manifest(copy)["calibration"]
    store = KBStore(copy, encoder, documents=BuilderDocuments())
    store.put("pier-0", {"text": "Timetables for the pier are posted weekly. Printed copies sit at the ticket desk.",
                         "label": None})
    assert store.bundle.manifest.raw["calibration"] == built
    assert store.compact()["recalibrated"] is False
    store.close()
    assert read_manifest(copy)["calibration"] == built


def _without_lexical(bundle, out):
    """`bundle` as a build from before the lexical index (what conftest's dense_only bundle does)."""
    import shutil

    from softknn.storage.bundle import finalize
    from softknn.storage.layout import data_files, read_manifest

    m = read_manifest(bundle)
    tmp = out.parent / f".{out.name}.tmp"
    tmp.mkdir()
    for name in data_files(m["memory"], lexical=False):
        shutil.copy2(bundle / name, tmp / name)
    old = {k: v for k, v in m.items() if k not in ("lexical", "files", "version_id", "created_at")}
    old["calibration"] = {"abstain_threshold": None}  # what a build without a lexical index records
    finalize(tmp, out, json.loads(json.dumps(old)))
    return out


def test_add_lexical_chooses_an_unlabelled_kbs_lambda_as_its_build_did(unlabelled_bundle, encoder, tmp_path):
    from softknn.index_builder.pipeline import add_lexical
    from softknn.storage.layout import read_manifest

    built = read_manifest(unlabelled_bundle)["calibration"]
    old = _without_lexical(unlabelled_bundle, tmp_path / "old")
    add_lexical(old, encoder)
    assert read_manifest(old)["calibration"] == built  # the same pseudo-queries, grid and choice
    plain = _without_lexical(unlabelled_bundle, tmp_path / "plain")
    add_lexical(plain)  # no encoder: the fixed λ (no recorded choice)
    assert read_manifest(plain)["calibration"] == {"abstain_threshold": None}


def test_add_lexical_refuses_a_model_other_than_the_bundles(unlabelled_bundle, encoder, tmp_path):
    from dataclasses import replace

    from softknn.common.errors import BundleError
    from softknn.index_builder.pipeline import add_lexical
    from softknn.storage.layout import read_manifest, verify_bundle

    old = _without_lexical(unlabelled_bundle, tmp_path / "old")
    before = verify_bundle(old)["version_id"]

    class Other:  # the same encoder under another model's fingerprint
        info = replace(encoder.info, fingerprint="0" * 64, name="other-model")

    with pytest.raises(BundleError, match="built with model .* not 'other-model'.*need the bundle's model"):
        add_lexical(old, Other())  # type: ignore[arg-type]
    assert verify_bundle(old)["version_id"] == before and "lexical" not in read_manifest(old)
    assert not list(tmp_path.glob(".old.tmp-*"))
