"""The seams of softknn.model.backends: the implementations the engine runs on satisfy their Protocols,
and the bundle-only retrieval (softknn.retrieval.search.Retriever) is what the Engine serves."""

import numpy as np

from softknn.infer.engine import Engine, InferParams, Retrieval
from softknn.model.backends import ChunkSearch, MemoryStore, ModelForward, ShardBackend
from softknn.retrieval.search import Retriever

QUERIES = ["Can I bring my dog on the Coral Line ferry to Brindlewick?", "lost umbrella"]


def test_the_model_index_and_memory_satisfy_their_protocols(engine, encoder, sample_bundle):
    assert isinstance(encoder, ModelForward)
    assert isinstance(sample_bundle.index, ChunkSearch) and isinstance(sample_bundle.kv, MemoryStore)
    assert engine.encoder is encoder and engine.memory is sample_bundle.kv
    assert engine.retriever.index is sample_bundle.index


def test_the_shard_backends_satisfy_their_protocol():
    from softknn.storage.ray_shards import RayShards
    from softknn.storage.shards import LocalShards

    assert isinstance(LocalShards([]), ShardBackend)
    assert all(callable(getattr(RayShards, name)) for name in ("call", "call_some", "health", "close"))  # no actors started


def test_the_engine_retrieves_through_a_retriever_of_the_bundle_alone(engine: Engine, encoder, sample_bundle):
    batch = encoder.tokenize(QUERIES)
    xq = encoder.forward_plain(batch).embedding.float().cpu().numpy()
    for p in (InferParams(k=4), InferParams(k=4, retrieval="dense"), InferParams(k=3, exact=True, retrieval="lexical"),
              InferParams(k=4, threshold=0.05)):
        alone = Retriever(sample_bundle)
        ps = alone.resolve([p] * len(QUERIES))
        assert ps == engine.resolve([p] * len(QUERIES))
        got, want = engine.retrieve(xq, ps, QUERIES), alone.retrieve(xq, ps, QUERIES)
        assert isinstance(got, Retrieval) and got == want
        row = got.rows[0][0]
        assert engine.matched_words(got, 0, row) == alone.matched_words(want, 0, row)
    assert np.isfinite(got.nearest).all()
