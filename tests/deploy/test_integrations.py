"""clients/integrations against a real `softknn serve` (one per module, an API key set), with the real
langchain-core and llama-index-core: each retriever returns the server's /v1/infer evidence as the
framework's documents, softknn's fields in metadata; LangChain's embeddings are /v1/embeddings'."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.harness import API_KEY, LiveServer
from tests.numerics import close

langchain_core = pytest.importorskip("langchain_core")
llama_index_core = pytest.importorskip("llama_index.core")

QUERY = "Can I bring my dog on the ferry?"
K = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory, sample_bundle_path):
    with LiveServer.start(sample_bundle_path, tmp_path_factory.mktemp("integrations") / "server.log",
                          ready_timeout=180.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live):
    from softknn_integrations import connect

    with connect(live.url, api_key=API_KEY) as c:
        yield c


@pytest.fixture(scope="module")
def want(live):
    """What the server itself answers for QUERY: (bundle_version, evidence items)."""
    r = live.client.post("/v1/infer", json={"inputs": [QUERY], "k": K, "evidence": K})
    assert r.status_code == 200, r.text
    return r.json()["bundle_version"], r.json()["results"][0]["evidence"]


def run_async(live, make):
    """`make(client)`'s coroutine, awaited in a fresh event loop with its own client (an async
    httpx client belongs to the loop it was opened in), closed after."""
    from softknn_integrations import connect

    async def main():
        async with connect(live.url, api_key=API_KEY) as c:
            return await make(c)

    return asyncio.run(main())


def assert_metadata(md: dict, item: dict, version: str) -> None:
    assert md["bundle_version"] == version
    assert (md["chunk_id"], md["doc_id"], md["start"], md["end"], md["label"], md["rank"]) == (
        item["chunk_id"], item["doc_id"], item["start"], item["end"], item["label"], item["rank"])
    for ours, theirs in (("w_db", "weight"), ("similarity", "similarity"), ("dense_similarity", "dense_similarity"),
                         ("bm25", "bm25"), ("mass_share", "mass_share"), ("influence", "influence")):
        assert md[ours] == item[theirs], ours  # the same JSON numbers, parsed twice
    assert md["matched_terms"] == item["matched_terms"]
    assert md["spans"] == [{k: s[k] for k in ("start", "end", "text", "weight", "share")} for s in item["spans"]]
    assert md["chunk_metadata"] == item["metadata"]


def test_langchain_retriever_returns_the_evidence(client, live, want):
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from softknn_integrations.langchain import SoftKNNRetriever

    version, evidence = want
    retriever = SoftKNNRetriever(client=client, k=K)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(QUERY)
    assert [type(d) for d in docs] == [Document] * K
    assert [d.id for d in docs] == [e["chunk_id"] for e in evidence]
    assert [d.page_content for d in docs] == [e["text"] for e in evidence]
    for d, e in zip(docs, evidence, strict=True):
        assert_metadata(d.metadata, e, version)
    again = run_async(live, lambda c: SoftKNNRetriever(client=c, k=K).ainvoke(QUERY))
    assert [d.metadata for d in again] == [d.metadata for d in docs]
    dense = SoftKNNRetriever(client=client, k=2, retrieval="dense").invoke(QUERY)
    assert len(dense) == 2 and all(d.metadata["bm25"] is None for d in dense)


def test_langchain_embeddings_are_the_services(client, live, encoder):
    from langchain_core.embeddings import Embeddings

    from softknn_integrations.langchain import SoftKNNEmbeddings

    texts = ["Dogs must stay on a lead on the car deck.", QUERY]
    emb = SoftKNNEmbeddings(client, model="all-MiniLM-L6-v2")
    assert isinstance(emb, Embeddings)
    ref = encoder.st.encode(texts)
    got = [emb.embed_documents(texts), [emb.embed_query(texts[0]), emb.embed_query(texts[1])],
           run_async(live, lambda c: SoftKNNEmbeddings(c).aembed_documents(texts))]
    for vectors in got:  # a text's embedding does not depend on its batch-mates beyond round-off
        v = np.asarray(vectors)
        assert v.shape == ref.shape and all(close(float(a), float(b), 1e-6) for a, b in zip(v.ravel(), ref.ravel()))
    aug = SoftKNNEmbeddings(client, augmented=True, options={"k": K}).embed_query(QUERY)
    r = live.client.post("/v1/infer", json={"inputs": [QUERY], "k": K}).json()["results"][0]["embedding"]
    assert all(close(a, b, 1e-6) for a, b in zip(aug, r, strict=True))


def test_llama_index_retriever_returns_the_evidence(client, live, want):
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import MetadataMode, NodeRelationship, NodeWithScore

    from softknn_integrations.llama_index import SoftKNNRetriever

    version, evidence = want
    retriever = SoftKNNRetriever(client, k=K)
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve(QUERY)
    assert [type(n) for n in nodes] == [NodeWithScore] * K
    assert [n.node.node_id for n in nodes] == [e["chunk_id"] for e in evidence]
    assert [n.score for n in nodes] == [e["weight"] for e in evidence]
    for n, e in zip(nodes, evidence, strict=True):
        assert n.node.get_content() == e["text"]
        assert (n.node.start_char_idx, n.node.end_char_idx) == (e["start"], e["end"])
        assert n.node.relationships[NodeRelationship.SOURCE].node_id == e["doc_id"]
        assert_metadata(n.node.metadata, e, version)
        assert "w_db" not in n.node.get_content(metadata_mode=MetadataMode.LLM)  # numbers stay out of prompts
    again = run_async(live, lambda c: SoftKNNRetriever(c, k=K).aretrieve(QUERY))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in nodes]


def test_refusals_raise_the_services_error(live):
    from softknn_integrations import SoftKNNError, connect
    from softknn_integrations.langchain import SoftKNNRetriever
    from softknn_integrations.llama_index import SoftKNNRetriever as LlamaRetriever

    with pytest.raises(SoftKNNError) as e:
        SoftKNNRetriever(client=connect(live.url, api_key="wrong"), k=K).invoke(QUERY)
    assert (e.value.status, e.value.kind) == (401, "unauthorized")
    with pytest.raises(SoftKNNError) as e:
        LlamaRetriever(connect(live.url, api_key=API_KEY), k=0).retrieve(QUERY)
    assert (e.value.status, e.value.kind, e.value.field) == (422, "validation_error", "k")
