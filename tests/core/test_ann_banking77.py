"""ANN recall against exact search, measured on Banking77 train (real text, the model's embeddings)."""

import csv
import json

import numpy as np
import pytest

from softknn.retrieval.chunk_index import ChunkIndex, build_index, choose_index
from tests.conftest import shared_data

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def banking77(encoder):
    def texts(name):
        with open(shared_data("banking77", name), newline="", encoding="utf-8") as f:
            return [row["text"] for row in csv.DictReader(f)]

    xb = encoder.st.encode(texts("train.csv"), batch_size=128, convert_to_numpy=True)
    xq = encoder.st.encode(texts("test.csv")[:600], batch_size=128, convert_to_numpy=True)
    return xb.astype(np.float32), xq.astype(np.float32)


@pytest.mark.parametrize("kind, floor", [("hnsw", 0.97), ("ivf", 0.95), ("ivfpq", 0.90)])
def test_ann_recall_at_10_against_exact_on_banking77_train(banking77, kind, floor, tmp_path_factory):
    xb, xq = banking77
    assert xb.shape == (10003, 384)
    spec = choose_index(len(xb), xb.shape[1], kind)
    ann = ChunkIndex(build_index(xb, spec), xb, spec)
    _, I_exact = ann.search(xq, 10, exact=True)
    D, I = ann.search(xq, 10)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I, I_exact)]))
    out = tmp_path_factory.getbasetemp() / f"ann_recall_{kind}.json"
    out.write_text(json.dumps({"kind": kind, "params": spec.params, "recall_at_10": recall, "queries": len(xq)}))
    print(f"\n{kind} {spec.params}: recall@10 = {recall:.4f} over {len(xq)} Banking77 test queries")
    assert recall >= floor
