"""softknn.retrieval.rerank: BM25 of any text with the KB's statistics equals the index's own BM25 for every KB
chunk's text, and the rerank score is the retrieval's normalisation (clipped, or raw)."""

from __future__ import annotations

import numpy as np

from softknn.retrieval.rerank import LexicalStats, bm25_texts, normalise, scores
from tests.numerics import close

QUERIES = ["Can I bring my dog on the ferry?", "refund for a cancelled sailing in the storm",
           "wheelchair access to the upper deck", "ferry ferry ferry timetable"]


def test_bm25_with_the_kbs_statistics_is_the_indexs_bm25_of_each_chunk(sample_bundle):
    lex = sample_bundle.lexical
    texts = [c["text"] for c in sample_bundle.chunks]
    stats = LexicalStats.of(texts, lex.analyzer)
    assert stats.n == len(texts)
    p = lex._indptr  # document frequency = posting-list length
    assert all(stats.df[t] == int(p[i + 1]) - int(p[i]) for t, i in lex.vocab.items() if t)
    terms = [lex.analyzer.terms(t) for t in texts]
    for q in QUERIES:
        q_terms = lex.analyzer.terms(q)
        want = lex.scores(q_terms)
        got = bm25_texts(q_terms, terms, stats, lex.spec)
        assert want.max() > 0
        assert all(close(float(g), float(w), 1e-5) for g, w in zip(got, want, strict=True)), q
    unknown = bm25_texts(["zzzunseen"], [["zzzunseen"]], stats, lex.spec)
    assert unknown.tolist() == [0.0]  # a word the KB never uses counts for nothing, as in the retrieval


def test_scores_by_definition():
    d, b = np.array([0.9, 0.5, 0.1]), np.array([4.0, 0.0, 2.0])
    d_range, b_range = (0.8, 0.4), (4.0, 1.0)
    assert np.allclose(normalise(d, *d_range), [1.0, 0.25, 0.0])
    assert np.allclose(normalise(d, *d_range, clip=False), [1.25, 0.25, -0.75])
    assert normalise(d, 0.5, 0.5).tolist() == [0.0, 0.0, 0.0]
    hybrid = scores("hybrid", d, d_range, b, b_range, 0.25)
    assert np.allclose(hybrid, [0.75 * 1.0 + 0.25 * 1.0, 0.75 * 0.25, 0.25 * (1 / 3)])
    raw = scores("hybrid", d, d_range, b, b_range, 0.25, raw=True)
    assert np.allclose(raw, [0.75 * 1.25 + 0.25 * 1.0, 0.75 * 0.25 + 0.25 * (-1 / 3), 0.75 * -0.75 + 0.25 * (1 / 3)])
    assert scores("dense", d, None, None, None, 0.25).tolist() == d.tolist()
    assert np.allclose(scores("lexical", d, None, b, b_range, 0.25), [1.0, 0.0, 1 / 3])
