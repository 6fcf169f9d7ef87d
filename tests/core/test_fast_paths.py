"""Fast paths against their plain references: per-row k-NN weights and bounds, faiss flat search."""

import numpy as np
import pytest
import torch

from softknn.model.attention import KERNELS, knn_weights, knn_weights_row, truncation_bound, truncation_bound_row
from softknn.retrieval.chunk_index import ChunkIndex, build_index, choose_index


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("temperature", [0.02, 0.05, 0.5])
def test_row_weights_and_bound_equal_the_torch_reference(kernel, temperature):
    rng = np.random.default_rng(7)
    for r in (1, 3, 8, 32):
        s = np.sort(rng.uniform(0.2, 0.95, r))[::-1].astype(np.float32)
        st = torch.from_numpy(s.copy())[None]
        valid = torch.ones_like(st, dtype=torch.bool)
        ref_w = knn_weights(st, valid, temperature, kernel)[0].numpy()
        fast_w = knn_weights_row(s, temperature, kernel)
        assert fast_w.dtype == np.float32
        np.testing.assert_allclose(fast_w, ref_w, rtol=0, atol=1e-7)
        for n_total in (r, r + 1, 10_000):
            ref_b = float(truncation_bound(st, valid, n_total, temperature, kernel)[0])
            assert truncation_bound_row(s, n_total, temperature, kernel) == pytest.approx(ref_b, rel=1e-6, abs=1e-12)


def test_row_weights_empty_window_and_empty_row():
    s = np.array([0.5, 0.4], dtype=np.float32)  # d² = 1.0, 1.2 > τ = 0.1: no chunk in the window
    assert knn_weights_row(s, 0.1, "uniform").tolist() == [0.0, 0.0]
    assert knn_weights_row(s, 0.1, "epanechnikov").tolist() == [0.0, 0.0]
    assert knn_weights_row(np.array([], dtype=np.float32), 0.1, "softmax").size == 0
    assert truncation_bound_row(np.array([], dtype=np.float32), 10, 0.1, "softmax") == 0.0


def _unit(rng, n, d=64):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference(xq, xb, k):
    """numpy float64 scores, ordered (score desc, id asc)."""
    s = xq.astype(np.float64) @ xb.astype(np.float64).T
    order = np.lexsort((np.broadcast_to(np.arange(len(xb)), s.shape), -s), axis=1)[:, :k]
    return order


def test_faiss_flat_search_equals_the_exact_search():
    rng = np.random.default_rng(3)
    xb, xq = _unit(rng, 3000), _unit(rng, 40)
    spec = choose_index(len(xb), xb.shape[1], "flat")
    index = ChunkIndex(build_index(xb, spec), xb, spec)
    for k in (1, 8, 32):
        D, I = index.search(xq, k)
        De, Ie = index.search(xq, k, exact=True)
        assert I.dtype == np.int64 and I.shape == (40, k)
        assert (I == Ie).all()
        np.testing.assert_allclose(D, De, rtol=0, atol=1e-6)
        assert (I == _reference(xq, xb, k)).all()


def test_faiss_flat_search_breaks_ties_by_the_lower_id_even_at_the_boundary():
    rng = np.random.default_rng(5)
    base = _unit(rng, 50)
    # rows 10..14 and 40..44 are copies of rows 0..4: every score among them ties exactly
    xb = np.concatenate([base[:40], base[:5], base[45:]])
    xb[10:15] = base[:5]
    xq = base[:5] + 0.05 * _unit(rng, 5)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    spec = choose_index(len(xb), xb.shape[1], "flat")
    index = ChunkIndex(build_index(xb, spec), xb, spec)
    for k in (1, 2, 3, 4, 6):  # k = 1, 2: the tie straddles the boundary; 3+: ties inside the top k
        _, I = index.search(xq, k)
        ref = _reference(xq, xb, k)
        assert (I == ref).all(), (k, I, ref)
        assert I[0, 0] == 0 and (k < 2 or I[0, 1] == 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kv_gather_equals_the_per_chunk_reference(dtype):
    from softknn.storage.memory_stores import KVStore

    rng = np.random.default_rng(11)
    count = rng.integers(1, 9, size=30)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    keys = rng.standard_normal((int(count.sum()), 3, 4)).astype(dtype)
    values = rng.standard_normal((int(count.sum()), 3, 4)).astype(dtype)
    kv = KVStore(keys, values, start, count)
    ids = [[5, 2, 29], [], [7], [2, 5, 0, 13, 29]]  # an empty R, a chunk shared by two inputs
    weights = [[0.5, 0.3, 0.2], [], [1.0], [0.4, 0.3, 0.1, 0.1, 0.1]]
    fast = kv.gather(ids, weights, torch.device("cpu"))
    ref = kv.gather_reference(ids, weights, torch.device("cpu"))
    for f in ("key", "value", "token_mask", "weight"):
        a, b = getattr(fast, f), getattr(ref, f)
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), f
    lm = max(int(count[c]) for r in ids for c in r)  # the longest retrieved chunk
    assert fast.key.is_contiguous() and fast.key.shape == (4, 3, 5, lm, 4)


def test_prefiltered_flat_search_is_exact_certified_or_not(monkeypatch):
    """≥ PREFILTER_MIN_CHUNKS chunks: the 8-bit prefilter + exact rescoring gives the exact answer;
    with a useless bound (every row uncertified) the full-scan fallback gives it too."""
    from softknn.retrieval import chunk_index

    rng = np.random.default_rng(13)
    n = chunk_index.PREFILTER_MIN_CHUNKS + 500
    xb = _unit(rng, n, 48)
    xb[100:110] = xb[:10]  # exact duplicates: ties the answer must order by id
    xq = xb[:30] + 0.1 * _unit(rng, 30, 48)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    spec = choose_index(n, 48, "flat")
    index = ChunkIndex(build_index(xb, spec), xb, spec)
    assert index._sq is not None and 0 < index._sq_err < 0.05
    for k in (1, 8, 32):
        D, I = index.search(xq, k)
        assert (I == _reference(xq, xb, k)).all()
        np.testing.assert_allclose(D, index.search(xq, k, exact=True)[0], rtol=0, atol=1e-5)
    assert index.prefilter_counts["certified"] > 0
    monkeypatch.setattr(index, "_sq_err", 10.0)  # nothing can be certified: all rows take the full scan
    before = dict(index.prefilter_counts)
    _, I = index.search(xq, 8)
    assert (I == _reference(xq, xb, 8)).all()
    assert index.prefilter_counts["full_scan"] - before["full_scan"] == 30
    assert index.prefilter_counts["certified"] == before["certified"]
