"""Hybrid and lexical retrieval: the lexical index, the fast path against the brute force,
`retrieval: "dense"` unchanged, bundles without a lexical index, and the evidence's why-fields."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.common.errors import InvalidInput
from softknn.infer.engine import Engine, InferParams
from softknn.infer.reference import reference_embedding, similarity_reference
from softknn.retrieval.lexical import Analyzer, LexicalIndex, LexicalSpec, bm25_reference
from softknn.retrieval.scoring import norm_top, scores_reference, topk_fast, topk_reference
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import verify_bundle

QUERIES = ["Can I bring my dog on the Coral Line ferry to Brindlewick?", "refund for a cancelled sailing",
           "wheelchair access at Saltbridge Pier", "lost property", "How long should I boil an egg?",
           "zzzz qqqq"]  # the last two: barely any / no lexical match


# --- the lexical index ----------------------------------------------------------------------------
def test_analyzer_lowercases_drops_stopwords_and_stems_keeping_spans():
    words = Analyzer(LexicalSpec()).words("The Dogs are travelling, a DOG's refunds!")
    assert words == [("dog", 4, 8), ("travel", 13, 23), ("dog", 27, 30), ("refund", 33, 40)]


def test_question_words_are_not_terms_and_a_bundle_keeps_the_analyser_it_was_built_with():
    q = "What does the with statement do, and how is it different from try?"
    new = LexicalSpec.from_manifest({**LexicalSpec().to_manifest(), "stopwords": "en+questions"})
    assert Analyzer(new).terms(q) == ["statement", "differ", "from", "tri"]
    old = LexicalSpec.from_manifest({**LexicalSpec().to_manifest(), "stopwords": "en"})  # as bundles were built
    assert LexicalSpec().stopwords == "en+questions"  # the default for new builds
    assert Analyzer(old).terms(q) == ["what", "doe", "statement", "do", "how", "differ", "from", "tri"]
    no_name = {k: v for k, v in LexicalSpec().to_manifest().items() if k != "stopwords"}
    assert LexicalSpec.from_manifest(no_name).stopwords == "en"  # stored without one: bm25s's list, as then
    # the index answers with its own analyser: the old one still matches the question words
    texts = ["What does the interpreter do at exit?", "The with statement wraps a block in a context manager."]
    for spec, best in ((new, 1), (old, 0)):
        idx = LexicalIndex.build(texts, spec)
        assert int(np.argmax(idx.scores(idx.analyzer.terms("what does the with statement do")))) == best
    with pytest.raises(ValueError, match="stopwords must be one of"):
        Analyzer(LexicalSpec(stopwords="fr"))


def test_bm25_scores_equal_the_formula_written_out(sample_bundle):
    lex = sample_bundle.lexical
    docs = [lex.analyzer.terms(c["text"]) for c in sample_bundle.chunks]
    for q in QUERIES + ["dog dog ferry"]:  # a repeated word counts twice in both
        terms = lex.analyzer.terms(q)
        got = lex.scores(terms)
        assert got.shape == (len(sample_bundle),) and got.dtype == np.float32
        np.testing.assert_allclose(got, bm25_reference(terms, docs), rtol=1e-5, atol=1e-6)
    assert not lex.scores(lex.analyzer.terms("zzzz qqqq")).any()


def test_matched_terms_are_the_query_terms_in_the_chunk(sample_bundle):
    lex = sample_bundle.lexical
    terms = lex.analyzer.terms("dogs on the ferry, refunds")
    for c in range(0, len(sample_bundle), 7):
        have = set(lex.analyzer.terms(sample_bundle.chunks[c]["text"]))
        assert lex.matched(terms, c) == have & set(terms)


def test_lexical_index_round_trips_and_its_files_are_checksummed(sample_bundle_path, tmp_path):
    m = verify_bundle(sample_bundle_path)
    assert m["lexical"]["settings"] == LexicalSpec().to_manifest()
    assert {n for n in m["files"] if n.startswith("lexical/")} == {
        "lexical/data.csc.index.npy", "lexical/indices.csc.index.npy", "lexical/indptr.csc.index.npy",
        "lexical/vocab.index.json", "lexical/params.index.json"}
    idx = LexicalIndex.build(["dogs on ferries", "a refund", "the the"])
    idx.save(tmp_path)
    back = LexicalIndex.load(tmp_path, LexicalSpec())
    np.testing.assert_array_equal(back.scores(["dog", "refund"]), idx.scores(["dog", "refund"]))
    assert back.scores(["dog"])[2] == 0.0  # an all-stopword chunk matches nothing


# --- the hybrid similarity: fast path vs brute force ---------------------------------------------
def test_norm_top_is_min_max_against_the_mth_best_clipped():
    x = np.array([0.9, 0.5, 0.7, 0.1, 0.3])
    np.testing.assert_allclose(norm_top(x, 0.9, 0.5), [1.0, 0.0, 0.5, 0.0, 0.0])
    assert not norm_top(np.ones(3), 1.0, 1.0).any()  # no spread: nothing to normalise


@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
def test_fast_topk_equals_the_brute_force_on_random_scores_with_ties(mode):
    rng = np.random.default_rng(0)
    undecided = 0
    for _trial in range(300):
        n = int(rng.integers(5, 400))
        d = np.round(rng.normal(0.3, 0.2, n), 2).astype(np.float32)  # rounded: many ties
        b = np.where(rng.random(n) < 0.3, np.round(rng.gamma(2.0, 2.0, n), 1), 0.0).astype(np.float32)
        k, m, lam = int(rng.integers(1, 30)), int(rng.integers(1, 60)), float(rng.random())
        order = np.lexsort((np.arange(n), -d))[: min(n, max(k, m))]  # what the exact dense search returns
        found = topk_fast(d[order], order, lambda ids: d[ids], b, k, mode, lam, m)  # noqa: B023 (called here)
        S, I = topk_reference(d, b, k, mode, lam, m)
        if found is None:  # only where chunks with s = 0 compete for the last places
            undecided += 1
            assert len(S) < k or S[-1] == 0.0 or min(n, k) > 0 and S[min(n, k) - 1] == 0.0
            continue
        np.testing.assert_array_equal(found[1], I)
        np.testing.assert_allclose(found[0], S, atol=1e-12)
    assert undecided < 300


@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
@pytest.mark.parametrize("k", [1, 5, 8, 40])
def test_engine_fast_path_equals_exact_brute_force(engine, mode, k):
    for q in QUERIES:
        p = dict(k=k, retrieval=mode, evidence=k)
        fast = engine.infer([q], InferParams(**p))[0]
        exact = engine.infer([q], InferParams(exact=True, **p))[0]
        by_id = lambda r: {e.chunk_id: e.similarity for e in r.evidence}  # noqa: E731
        assert by_id(fast).keys() == by_id(exact).keys(), q
        assert max(abs(by_id(fast)[c] - by_id(exact)[c]) for c in by_id(fast)) <= 1e-6
        assert np.abs(np.array(fast.embedding) - np.array(exact.embedding)).max() <= 1e-5


@pytest.mark.parametrize("mode,lam,mixing", [("hybrid", 0.5, "fixed"), ("hybrid", 0.2, "joint"),
                                             ("lexical", 0.5, "fixed")])
def test_exact_hybrid_over_the_whole_kb_equals_the_brute_force_reference(engine, encoder, sample_bundle, mode,
                                                                        lam, mixing):
    """k = N with exact: the engine's hybrid scores, weights and fused embedding against
    softknn.infer.reference (float64 dense scores, BM25 from its formula, the loop attention)."""
    n, q = len(sample_bundle), QUERIES[0]
    res = engine.infer([q], InferParams(alpha=0.7, mixing=mixing, k=n, temperature=0.1, exact=True, evidence=n,
                                        retrieval=mode, lexical_weight=lam))[0]
    ref, rows, w = reference_embedding(encoder, sample_bundle, q, alpha=0.7, mixing=mixing, k=n, temperature=0.1,
                                       retrieval=mode, lexical_weight=lam)
    assert res.diagnostics.retrieved == len(rows) == n
    assert np.abs(np.array(res.embedding) - ref).max() <= 1e-5
    got = {e.chunk_id: e.weight for e in res.evidence}
    want = {sample_bundle.chunks[r]["chunk_id"]: x for r, x in zip(rows, w)}
    assert got.keys() == want.keys()
    assert max(abs(got[c] - want[c]) for c in want) <= 1e-6


def test_hybrid_top_k_ranks_by_the_mixed_similarity(engine, encoder, sample_bundle):
    q = QUERIES[0]
    r = engine.infer([q], InferParams(k=8, retrieval="hybrid", lexical_weight=0.5, evidence=8))[0]
    e_q = encoder.st.encode([q], convert_to_numpy=True)[0]
    s = similarity_reference(sample_bundle, e_q, q, "hybrid", 0.5)
    want = [sample_bundle.chunks[c]["chunk_id"] for c in np.lexsort((np.arange(len(s)), -s))[:8]]
    got = sorted(r.evidence, key=lambda e: (-e.similarity, e.chunk_id))
    assert [e.chunk_id for e in got] == want
    for e in got:
        assert e.similarity == pytest.approx(s[sample_bundle.row_of(e.chunk_id)], abs=1e-6)


# --- evidence shows why ----------------------------------------------------------------------------
def test_evidence_carries_dense_similarity_bm25_and_the_matched_words(engine, encoder, sample_bundle):
    q = "Can I bring my dogs on the Coral Line?"
    r = engine.infer([q], InferParams(k=5, evidence=5))[0]
    assert r.diagnostics.retrieval == "hybrid"  # the default where the bundle has a lexical index
    e_q = encoder.st.encode([q], convert_to_numpy=True)[0]
    lex = sample_bundle.lexical
    bm25 = lex.scores(lex.analyzer.terms(q))
    for e in r.evidence:
        row = sample_bundle.row_of(e.chunk_id)
        assert e.dense_similarity == pytest.approx(float(np.asarray(sample_bundle.index.xb)[row] @ e_q), abs=1e-5)
        assert e.bm25 == pytest.approx(float(bm25[row]), rel=1e-5)  # a BM25 score is unbounded: relative
        chunk_terms = set(lex.analyzer.terms(e.text))
        want = [w for t, s, t_end in lex.analyzer.words(q) for w in [q[s:t_end]] if t in chunk_terms]
        assert e.matched_terms == list(dict.fromkeys(want))
    dogs = next(e for e in r.evidence if "dog" in e.text.lower())
    assert "dogs" in dogs.matched_terms  # the input's own word, matched through its stem
    dense = engine.infer([q], InferParams(k=5, evidence=5, retrieval="dense"))[0]
    assert all(e.bm25 is None and e.matched_terms is None for e in dense.evidence)
    assert all(e.dense_similarity == e.similarity for e in dense.evidence)


# --- dense unchanged; bundles without a lexical index ----------------------------------------------
def test_dense_retrieval_is_identical_on_a_bundle_with_and_without_a_lexical_index(encoder, dense_only_bundle_path,
                                                                                  engine):
    old = Engine(encoder, load_bundle(dense_only_bundle_path))
    for exact in (False, True):
        p = InferParams(k=6, exact=exact, evidence=6, temperature=0.05)
        before = old.infer(QUERIES, p)  # a bundle from before: dense is its default
        after = engine.infer(QUERIES, InferParams(k=6, exact=exact, evidence=6, temperature=0.05, retrieval="dense"))
        for a, b in zip(before, after, strict=True):
            assert a.embedding == b.embedding
            assert [(e.chunk_id, e.similarity, e.weight) for e in a.evidence] == [
                (e.chunk_id, e.similarity, e.weight) for e in b.evidence]
            assert a.diagnostics.retrieval == b.diagnostics.retrieval == "dense"


def test_a_bundle_without_a_lexical_index_serves_dense_and_refuses_hybrid(encoder, dense_only_bundle_path):
    b = load_bundle(dense_only_bundle_path)
    assert b.lexical is None
    assert b.summary()["lexical"]["available"] is False and b.summary()["lexical"]["default_retrieval"] == "dense"
    eng = Engine(encoder, b)
    for mode in ("hybrid", "lexical"):
        with pytest.raises(InvalidInput) as e:
            eng.infer(["dogs"], InferParams(retrieval=mode))
        assert e.value.field == "retrieval" and "softknn add-lexical" in str(e.value)


def test_add_lexical_upgrades_an_old_bundle_in_place(encoder, dense_only_bundle_path, tmp_path, engine):
    import shutil

    from softknn.index_builder.pipeline import add_lexical

    old = tmp_path / "old"
    shutil.copytree(dense_only_bundle_path, old)
    m = add_lexical(old)
    assert verify_bundle(old)["version_id"] == m["version_id"] != verify_bundle(dense_only_bundle_path)["version_id"]
    up = Engine(encoder, load_bundle(old))
    a = up.infer(QUERIES[:3], InferParams(k=5, evidence=5))
    b = engine.infer(QUERIES[:3], InferParams(k=5, evidence=5))  # a fresh build with its lexical index
    assert [[e.chunk_id for e in r.evidence] for r in a] == [[e.chunk_id for e in r.evidence] for r in b]
    assert not list(tmp_path.glob(".old.tmp-*"))


def test_scores_reference_modes():
    d = np.array([0.8, 0.6, 0.4, 0.2])
    b = np.array([0.0, 3.0, 6.0, 0.0])
    np.testing.assert_array_equal(scores_reference(d, b, "dense", 0.5, 2), d)
    np.testing.assert_allclose(scores_reference(d, b, "lexical", 0.5, 2), [0.0, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(scores_reference(d, b, "hybrid", 0.5, 2), [0.5, 0.0, 0.5, 0.0])
