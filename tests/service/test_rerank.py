"""POST /v1/rerank (text-embeddings-inference's schema) over the sample bundle, in process: a KB
chunk's text scores exactly the similarity the retrieval ranks it by (the hybrid of dense and BM25
with the KB's statistics and the bundle's λ), so rerank orders KB texts as the retrieval does;
dense and raw scores by their definitions; top_n, return_text, ties; errors in the service's shape."""

from __future__ import annotations

import numpy as np
import pytest

from softknn.infer.engine import InferParams
from softknn.retrieval.scoring import scores_reference
from tests.numerics import close

QUERY = "Can I bring my dog on the ferry, and does it need a ticket?"
TOL = 1e-5


@pytest.fixture(scope="module")
def reference(engine):
    """The retrieval's hybrid s_c over every chunk of the KB for QUERY (the brute force), and its params."""
    p = engine.resolve([InferParams()])[0]
    e_q = engine.encoder.forward_plain(engine.encoder.tokenize([QUERY])).embedding.float().numpy()
    d = engine.retriever.index.similarities(e_q)[0].numpy()
    b = engine.bundle.lexical.scores(engine.bundle.lexical.analyzer.terms(QUERY))
    return scores_reference(d, b, "hybrid", p.lexical_weight, p.candidates), d, p


def rerank(api, **body):
    r = api.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_kb_texts_score_their_retrieval_similarity_and_order_alike(inproc, engine, reference):
    s, _, p = reference
    assert p.retrieval == "hybrid"
    order = np.lexsort((np.arange(len(s)), -s))
    rows = [int(r) for r in order[:12]] + [int(r) for r in order[12::25]]  # the best and a spread of the rest
    texts = [engine.bundle.chunks[r]["text"] for r in rows]
    got = rerank(inproc, query=QUERY, texts=texts)
    assert sorted(g["index"] for g in got) == list(range(len(rows)))
    for g in got:
        assert close(g["score"], float(s[rows[g["index"]]]), TOL), (g, s[rows[g["index"]]])
    ranked = [rows[g["index"]] for g in got]
    assert all(s[a] >= s[b] - TOL for a, b in zip(ranked, ranked[1:]))  # the retrieval's order, ties aside
    assert sum(s[r] > 0 for r in rows) >= 12  # the comparison covers scores that are not clipped to 0


def test_retrieved_evidence_scores_its_similarity(inproc):
    r = inproc.post("/v1/infer", json={"inputs": [QUERY], "k": 6, "evidence": 6})
    evidence = r.json()["results"][0]["evidence"]
    got = rerank(inproc, query=QUERY, texts=[e["text"] for e in evidence])
    for g in got:
        assert close(g["score"], evidence[g["index"]]["similarity"], TOL)


def test_dense_and_raw_scores(inproc, encoder, reference):
    texts = ["Dogs must stay on a lead on the car deck.", "The moon is made of cheese.",
             "Pets travel free of charge in a carrier."]
    e = encoder.st.encode([QUERY, *texts])
    dense = rerank(inproc, query=QUERY, texts=texts, retrieval="dense")
    for g in dense:
        assert close(g["score"], float(e[0] @ e[1 + g["index"]]), TOL)
    clipped = {g["index"]: g["score"] for g in rerank(inproc, query=QUERY, texts=texts)}
    raw = {g["index"]: g["score"] for g in rerank(inproc, query=QUERY, texts=texts, raw_scores=True)}
    assert clipped[1] == 0.0 and raw[1] < 0  # far below the KB's m-th: clipped to 0, raw keeps its distance
    for i in (0, 2):  # within the KB's range the clip changes nothing
        assert 0 < clipped[i] < 1 and raw[i] == clipped[i]
    assert [g["index"] for g in dense] == [2, 0, 1]
    lexical = rerank(inproc, query=QUERY, texts=texts, retrieval="lexical")
    assert {g["index"]: g["score"] for g in lexical}[1] == 0.0  # no query word in it


def test_top_n_return_text_and_ties(inproc):
    texts = ["The cafe serves hot food.", "Dogs are welcome on a lead.", "The cafe serves hot food."]
    got = rerank(inproc, query=QUERY, texts=texts, return_text=True, top_n=2)
    assert [g["index"] for g in got] == [1, 0] and [g["text"] for g in got] == [texts[1], texts[0]]
    every = rerank(inproc, query=QUERY, texts=texts)
    assert [g["index"] for g in every] == [1, 0, 2] and every[1]["score"] == every[2]["score"]
    assert all(set(g) == {"index", "score"} for g in every)  # no text unless asked


@pytest.mark.parametrize(("body", "status", "kind", "field"), [
    ({"query": QUERY, "texts": []}, 422, "validation_error", "texts"),
    ({"query": QUERY, "texts": ["fine", " "]}, 422, "validation_error", "texts[1]"),
    ({"query": "", "texts": ["fine"]}, 422, "validation_error", "query"),
    ({"query": QUERY, "texts": ["fine"], "top_n": 0}, 422, "validation_error", "top_n"),
    ({"query": QUERY, "texts": ["fine"], "truncation_direction": "left"}, 422, "validation_error",
     "truncation_direction"),
    ({"query": QUERY, "texts": ["fine"] * 65}, 413, "input_too_large", "texts"),
    ({"query": QUERY, "texts": ["fine", " ".join(["ferry"] * 400)]}, 413, "input_too_large", "texts[1]"),
    ({"query": " ".join(["ferry"] * 400), "texts": ["fine"]}, 413, "input_too_large", "query"),
])
def test_errors_in_the_service_shape(inproc, body, status, kind, field):
    r = inproc.post("/v1/rerank", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"type", "message", "field"}
    assert (r.json()["error"]["type"], r.json()["error"]["field"]) == (kind, field)


def test_truncate_cuts_instead(inproc):
    got = rerank(inproc, query=QUERY, texts=["fine", " ".join(["ferry"] * 400)], truncate=True)
    assert len(got) == 2


def test_usage_doc_sample_is_what_the_service_answers(inproc):
    import json
    import re

    from tests.service.conftest import REPO

    readme = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    block = readme[readme.index("$ curl -s localhost:8000/v1/rerank"):]
    body = json.loads(re.search(r"-d '(\{.*?\})'", block, re.S).group(1))
    shown = json.loads(block.splitlines()[3])
    got = rerank(inproc, **body)
    assert [(g["index"], g["text"]) for g in got] == [(s["index"], s["text"]) for s in shown]
    assert all(close(g["score"], s["score"], 1e-6) for g, s in zip(got, shown, strict=True))
    raw = rerank(inproc, **body, raw_scores=True)
    assert f"(the cafe scores {raw[2]['score']:.3f} above)".replace("-", "−") in readme
