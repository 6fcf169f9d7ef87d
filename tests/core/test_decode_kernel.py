"""The decode graph's attention in the C kernel (softknn.generate.kernel) against its references: ONNX
Runtime's GroupQueryAttention on the same int8 cache (the op the whole graph runs), a float64 numpy
computation, and the whole graph: the segmented graph around the kernel keeps the float graph's logits and
evidence as the whole graph does (batched decoding still giving each request its solo tokens, to the bit:
tests/core/test_decode_graph.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from softknn.common.errors import ModelRuntimeError
from softknn.generate import kernel
from softknn.generate.batch import DecodeLoop, decoder_session, job_for
from softknn.generate.model import Generator, Sampling
from softknn.generate.runtime import DecoderSession, SplitBound, SplitDecoderSession
from tests.core.test_decode_graph import _first_steps_agree

H, KV, D = 9, 3, 64  # SmolLM2-135M's heads, kv heads and head dim (the kernel's register-resident case)


@pytest.fixture(scope="module", params=[False, True], ids=["native", "generic"])
def kern(request, tmp_path_factory) -> kernel.Kernel:
    """The kernel as this machine builds it (AVX-512 intrinsics where the CPU has them), and its plain C loops."""
    k, why = kernel.load(tmp_path_factory.mktemp("kernel"), generic=request.param)
    if k is None:  # CI and the images have gcc: a missing compiler here is a broken machine, not a skip
        pytest.fail(f"the attention kernel did not build: {why}")
    return k


def _gqa(heads: int, kv_heads: int, dim: int):
    """One GroupQueryAttention node over an int8 cache, as graph.build_decoder writes it, with its
    probabilities (qk_output 2) as an output."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, ["B", "T", heads * dim]),
           helper.make_tensor_value_info("k", f, ["B", "T", kv_heads * dim]),
           helper.make_tensor_value_info("v", f, ["B", "T", kv_heads * dim]),
           helper.make_tensor_value_info("past_key", TensorProto.INT8, ["B", kv_heads, "C", dim]),
           helper.make_tensor_value_info("past_value", TensorProto.INT8, ["B", kv_heads, "C", dim]),
           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
           helper.make_tensor_value_info("total", TensorProto.INT32, []),
           helper.make_tensor_value_info("bias", f, ["B", 1, "T", "S"]),
           helper.make_tensor_value_info("ks", f, [kv_heads * dim]),
           helper.make_tensor_value_info("vs", f, [kv_heads * dim])]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in
            (("o", f), ("present_key", TensorProto.INT8), ("present_value", TensorProto.INT8), ("qk", f))]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total",
                                                    "", "", "", "bias", "", "ks", "vs"],
                            ["o", "present_key", "present_value", "qk"], domain="com.microsoft", num_heads=heads,
                            kv_num_heads=kv_heads, scale=1.0, qk_output=2, k_quant_type="PER_CHANNEL",
                            v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
    model = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _case(B: int, T: int, pasts: list[int], seed: int, heads: int = H, kv_heads: int = KV, dim: int = D):
    """Random q, k, v of a real layer's spread (keys ~0.25, scores ~2), caches of random codes past each row's
    own columns, a bias with the k-NN prior on the first columns and −inf on a few (a prefix row's view)."""
    rng = np.random.default_rng(seed)
    seqlens = np.array([p + T - 1 for p in pasts], dtype=np.int32)
    S = int(seqlens.max()) + 1
    C = S + 5
    q = (rng.standard_normal((B, T, heads * dim)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((B, T, kv_heads * dim)) * 0.25).astype(np.float32)
    v = (rng.standard_normal((B, T, kv_heads * dim)) * 0.25).astype(np.float32)
    K = rng.integers(-127, 128, (B, kv_heads, C, dim)).astype(np.int8)
    V = rng.integers(-127, 128, (B, kv_heads, C, dim)).astype(np.int8)
    ks = (rng.random(kv_heads * dim) * 0.004 + 0.001).astype(np.float32)  # codes ±127 → keys within ±0.64
    vs = (rng.random(kv_heads * dim) * 0.004 + 0.001).astype(np.float32)
    bias = np.zeros((B, 1, T, S), np.float32)
    bias[:, :, :, :4] = np.log(0.3)  # a chunk's prior
    bias[:, :, : max(T - 2, 0), 4:6] = -np.inf  # the first rows may not see two columns
    return q, k, v, K, V, ks, vs, seqlens, bias


@pytest.mark.parametrize(("B", "T", "pasts"), [(1, 1, [40]), (4, 1, [40, 3, 17, 0]), (1, 6, [30]), (1, 9, [0]),
                                               (1, 40, [900])])
def test_the_kernel_is_group_query_attention_on_the_same_int8_cache(kern, B, T, pasts):
    """Rows of different lengths, decode steps and prefills (causal among the new tokens): the same cache bytes
    written (the new keys and values rounded alike), outputs within 1e-6 (measured ≤ 1.2e-7: float32 sums in
    another order), the last token's probabilities summed over the heads within 1e-6."""
    q, k, v, K, V, ks, vs, seqlens, bias = _case(B, T, pasts, seed=B * 100 + T)
    S = bias.shape[-1]
    K2, V2 = K.copy(), V.copy()
    ref_o, ref_k, ref_v, ref_p = _gqa(H, KV, D).run(None, {
        "q": q, "k": k, "v": v, "past_key": K, "past_value": V, "seqlens_k": seqlens, "total": np.array(S, np.int32),
        "bias": bias, "ks": ks, "vs": vs})
    out, attn = np.zeros_like(q), np.zeros((B, S), np.float32)
    kern.attend(q, k, v, K2, V2, ks, vs, seqlens, np.ascontiguousarray(bias.reshape(B, T, S)), out, attn, 1.0)
    for b, past in enumerate(pasts):  # ORT returns the cache bound as present: compare the columns it holds
        n = past + T
        assert np.array_equal(ref_k[b, :, :n], K2[b, :, :n]) and np.array_equal(ref_v[b, :, :n], V2[b, :, :n])
        assert np.abs(ref_p[b, :, -1, :n].sum(0) - attn[b, :n]).max() <= 1e-6
        assert not attn[b, n:].any()
    assert np.abs(ref_o - out).max() <= 1e-6


def test_the_kernel_is_its_float64_reference_for_any_grouping(kern):
    """Another shape than SmolLM2's (4 heads over 2 kv heads of 32 dims: the general p·v loop)."""
    q, k, v, K, V, ks, vs, seqlens, bias = _case(3, 2, [9, 0, 21], seed=7, heads=4, kv_heads=2, dim=32)
    B, T, S = 3, 2, bias.shape[-1]
    K2, V2 = K.copy(), V.copy()
    out, attn = np.zeros_like(q), np.zeros((B, S), np.float32)
    kern.attend(q, k, v, K, V, ks, vs, seqlens, np.ascontiguousarray(bias.reshape(B, T, S)), out, attn, 0.5)
    ref_o, ref_p = kernel.attend_reference(q, k, v, K2, V2, ks, vs, seqlens, bias.reshape(B, T, S))
    assert np.array_equal(K, K2) and np.array_equal(V, V2)
    assert np.abs(out - ref_o).max() <= 2e-6 and np.abs(attn - 0.5 * ref_p).max() <= 1e-6


def test_rows_of_fewer_tokens_are_the_rows_alone_and_their_padding_is_not_written(kern):
    """A prefill of three prompts padded to 7 tokens (tlen 7, 2, 4): each row's output, cache and last-token
    probabilities are those of the row run alone with its own tokens, to the bit; the padding's columns keep
    their bytes and its outputs are not written."""
    q, k, v, K, V, ks, vs, _, bias = _case(3, 7, [30, 12, 0], seed=11)
    tlen = np.array([7, 2, 4], np.int32)
    seqlens = np.array([30 + 6, 12 + 1, 0 + 3], np.int32)  # each row's past + its own tokens − 1
    S = bias.shape[-1]
    b3 = np.ascontiguousarray(bias.reshape(3, 7, S))
    before, vbefore = K.copy(), V.copy()
    out, attn = np.full_like(q, 7.0), np.zeros((3, S), np.float32)
    kern.attend(q, k, v, K, V, ks, vs, seqlens, b3, out, attn, 1.0, tlen)
    for b, t in enumerate(tlen):
        K1, V1 = before[b : b + 1].copy(), vbefore[b : b + 1].copy()
        o1, a1 = np.zeros((1, t, H * D), np.float32), np.zeros((1, S), np.float32)
        kern.attend(np.ascontiguousarray(q[b : b + 1, :t]), np.ascontiguousarray(k[b : b + 1, :t]),
                    np.ascontiguousarray(v[b : b + 1, :t]), K1, V1, ks, vs, seqlens[b : b + 1],
                    np.ascontiguousarray(b3[b : b + 1, :t]), o1, a1, 1.0)
        assert np.array_equal(o1[0], out[b, :t]) and np.array_equal(a1[0], attn[b])
        assert np.array_equal(K1[0], K[b]) and np.array_equal(V1[0], V[b])
        assert (out[b, t:] == 7.0).all()  # padding: not written
        assert np.array_equal(K[b, :, seqlens[b] + 1 :], before[b, :, seqlens[b] + 1 :])
        assert not np.array_equal(K[b], before[b])  # its own columns were written


@pytest.mark.parametrize(("B", "T", "pasts", "tlen"), [(16, 1, [300 + 37 * i for i in range(16)], None),
                                                       (1, 40, [900], None), (3, 37, [500, 200, 0], [37, 5, 20])])
def test_the_kernels_threads_share_a_call_and_give_its_result_to_the_bit(kern, B, T, pasts, tlen):
    """A 16-row decode step, a 40-token prefill (tokens in blocks of 16 over threads) and three padded prompts:
    with 2 and 3 threads the same outputs, cache bytes and trace as with 1, to the bit, and the calls were
    shared (the workers ran); a one-row step (~2,700 column reads) stays on the caller."""
    q, k, v, K, V, ks, vs, seqlens, bias = _case(B, T, pasts, seed=B + T)
    S = bias.shape[-1]
    b3 = np.ascontiguousarray(bias.reshape(B, T, S))
    tl = None if tlen is None else np.array(tlen, np.int32)
    if tl is not None:
        seqlens = np.array([p + t - 1 for p, t in zip(pasts, tlen)], np.int32)
    results = []
    for threads in (1, 2, 3):
        K1, V1 = K.copy(), V.copy()
        out, attn = np.zeros_like(q), np.zeros((B, S), np.float32)
        shared = kern.shared_calls()
        kern.attend(q, k, v, K1, V1, ks, vs, seqlens, b3, out, attn, 0.25, tl, threads=threads)
        assert kern.shared_calls() - shared == (threads > 1)
        results.append((out, attn, K1, V1))
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], other))
    ref_o, ref_p = kernel.attend_reference(q, k, v, K.copy(), V.copy(), ks, vs, seqlens, b3, tl)
    assert np.abs(results[0][0] - ref_o).max() <= 2e-6 and np.abs(results[0][1] - 0.25 * ref_p).max() <= 1e-6
    q, k, v, K, V, ks, vs, seqlens, bias = _case(1, 1, [890], seed=5)
    shared = kern.shared_calls()
    kern.attend(q, k, v, K, V, ks, vs, seqlens, bias.reshape(1, 1, -1), np.zeros_like(q), threads=2)
    assert kern.shared_calls() == shared


def test_the_kernels_layout_of_a_memory_is_the_numpy_layout_to_the_bit(kern):
    """KVCache.layout with the kernel (one pass a chunk) against layout_reference (numpy, a layer at a time):
    three chunks at three of four layers, values on rounding ties (x / s = k + 0.5, ties to even) and past
    ±127 (clipped), the same int8 bytes; bad input refused."""
    from softknn.generate.batch import KVCache, PackedMemory

    rng = np.random.default_rng(3)
    L, layers = 4, [0, 2, 3]
    scales = (rng.random((L, 2, KV, D)) * 0.01 + 0.002).astype(np.float32)
    chunks = []
    for n in (5, 17, 1):
        codes = rng.integers(-140, 141, (n, len(layers), 2, KV, D)).astype(np.float32)
        codes[:, :, :, :, :8] += 0.5  # ties
        chunks.append((codes * scales[layers][None]).astype(np.float32))
    M = sum(c.shape[0] for c in chunks)
    mem = PackedMemory(chunks, layers, np.zeros(M, np.float32), np.repeat(np.arange(3), [5, 17, 1]), [5, 17, 1], 0, 0)
    fast = KVCache(L, KV, D, scales, kern).layout(mem)
    ref = KVCache(L, KV, D, scales).layout_reference(mem)
    assert fast[0].dtype == np.int8 and fast[0].shape == (3, KV, M, D)
    assert np.array_equal(fast[0], ref[0]) and np.array_equal(fast[1], ref[1])
    assert fast[0].max() == 127 and fast[0].min() == -127  # clipped
    with pytest.raises(ValueError, match="shapes do not agree"):
        kern.layout(chunks[0], np.ascontiguousarray(scales[layers]), fast[0], fast[1], M - 2)


@pytest.mark.parametrize("kind", ["fp32", "fp16", "q4", "q2"])
def test_stored_chunks_laid_out_from_their_bytes_are_their_decoded_layout_to_the_bit(kern, tmp_path, kind):
    """KVCache.layout_stored (the kernel straight from a store's fp32 / fp16 / q4 / q2 bytes) against
    layout_stored_reference (the store's decode to float32 rows, then numpy's layout): the same int8 bytes,
    for chunks of 1, 9 and 40 tokens at three layers, with rounding ties, clipping, float16 subnormals and
    negative zeros; a second call is served from the LRU, which keeps within its bytes."""
    from softknn.generate.batch import KVCache
    from softknn.generate.memory import GeneratorStore, encode_chunk
    from softknn.storage.layout import GEN_DIR

    rng = np.random.default_rng(11)
    L = 3
    scales = (2.0 ** rng.integers(-9, -5, (L, 2, KV, D))).astype(np.float32)  # powers of two: exact ties in fp16
    lengths = [1, 9, 40]
    rows = []
    for n in lengths:
        codes = rng.integers(-150, 151, (n, L, 2, KV, D)).astype(np.float32)
        codes[:, :, :, :, :6] += 0.5  # ties (x / s = k + 0.5)
        kv = codes * scales[None]
        kv[:, :, :, :, 6] = -0.0
        kv[:, :, :, :, 7] = 3e-6 * rng.standard_normal((n, L, 2, KV))  # below float16's normal range
        rows.append(kv.astype(np.float32))
    d = tmp_path / GEN_DIR
    d.mkdir()
    enc = [encode_chunk(kv, kind) for kv in rows]
    for name in enc[0]:
        np.save(d / f"{name}.npy", np.concatenate([e[name] for e in enc]))
    np.save(d / "tokens.npy", np.zeros(sum(lengths), np.int32))
    np.save(d / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    store = GeneratorStore(tmp_path, {"memory": kind, "layers": [0, 1, 2]}, len(lengths))
    cache = KVCache(L, KV, D, scales, kern)
    assert cache.lays_stored(kind) and not KVCache(L, KV, D, scales).lays_stored(kind)
    got = cache.layout_stored(store, [2, 0, 1])
    for r, (keys, values) in zip([2, 0, 1], got, strict=True):
        ref = cache.layout_stored_reference(store, r)
        assert keys.shape == (L, KV, lengths[r], D) and keys.dtype == np.int8
        assert np.array_equal(keys, ref[0]) and np.array_equal(values, ref[1]), (kind, r)
    assert max(int(k.max()) for k, _ in got) == 127 and min(int(k.min()) for k, _ in got) == -127  # clipped
    assert (cache.laid_hits, cache.laid_misses) == (0, 3)
    again = cache.layout_stored(store, [1, 0, 1])
    assert again[0] is got[2] and again[1] is got[1] and again[2] is got[2]
    assert (cache.laid_hits, cache.laid_misses) == (2, 3)  # chunks served, each once
    small = KVCache(L, KV, D, scales, kern)
    small.laid_cache_bytes = 2 * got[0][0].nbytes  # room for the 40-token chunk alone: the least recent leave
    small.layout_stored(store, [0, 2, 1])
    assert [r for _, r in small._laid] == [1] and small._laid_bytes == 2 * got[2][0].nbytes


def test_the_kernel_refuses_what_it_cannot_read(kern):
    q, k, v, K, V, ks, vs, seqlens, bias = _case(1, 1, [5], seed=1)
    S = bias.shape[-1]
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match="K must be C-contiguous int8"):
        kern.attend(q, k, v, K.astype(np.int16), V, ks, vs, seqlens, bias.reshape(1, 1, S), out)
    with pytest.raises(ValueError, match="a row does not fit"):
        kern.attend(q, k, v, K, V, ks, vs, seqlens + 100, np.zeros((1, 1, S + 100), np.float32), out)


def test_without_a_compiler_the_kernel_says_why_and_auto_keeps_group_query_attention(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    kernel.load.cache_clear()
    try:
        k, why = kernel.load(tmp_path)
        assert k is None and why == "no C compiler (cc/gcc, or $CC)"
    finally:
        kernel.load.cache_clear()
    calls = []
    monkeypatch.setattr(kernel, "load", lambda d: calls.append(d) or (None, "no C compiler (cc/gcc, or $CC)"))
    monkeypatch.setattr("softknn.generate.batch.DecoderSession", lambda *a, **kw: ("whole graph", kw["kv"]))
    gen = Generator.__new__(Generator)
    gen.calibration_ids = lambda: [1, 2, 3]  # type: ignore[method-assign]
    gen.model = None
    with caplog.at_level(logging.WARNING, logger="softknn.generate.batch"):
        assert decoder_session(gen, "w8a8", [0], kv="int8", attention="auto") == ("whole graph", "int8")
    assert "the C kernel did not build: no C compiler" in caplog.text
    with pytest.raises(ModelRuntimeError, match="attention kernel did not build: no C compiler"):
        decoder_session(gen, "w8a8", [0], kv="int8", attention="kernel")
    assert decoder_session(gen, "w8a8", [0], kv="int8", attention="graph") == ("whole graph", "int8")
    assert decoder_session(gen, "w8a8", [0], kv="fp32", attention="auto") == ("whole graph", "fp32")
    assert len(calls) == 2  # graph and a float32 cache never build it


# --- the segmented graph around the kernel, on SmolLM2 ------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> Generator:
    return Generator.load()


@pytest.fixture(scope="module")
def split(smol) -> SplitDecoderSession:
    """w8a8 weights, the int8 cache, the kernel: what a server decodes with by default."""
    s = decoder_session(smol, "w8a8", list(range(smol.info.num_layers)), kv="int8", attention="kernel")
    assert isinstance(s, SplitDecoderSession)
    return s


def test_the_kernels_graph_keeps_the_float_graphs_attention_and_logits(smol, split):
    """Against the float32 graph and cache, with memory (k 4, β 4): as the whole w8a8 graph over the int8 cache
    (tests/core/test_decode_graph.py, 8% of the logits' spread, the trace within 0.02)."""
    _first_steps_agree(smol, DecoderSession(smol.model, "fp32", list(range(smol.info.num_layers))), split,
                       logits=0.08, trace=0.02)


def test_a_steps_lanes_give_each_row_what_one_lane_gives_to_the_bit(smol, split):
    """A 5-row decode step cut into two lanes (rows 0–1 and 2–4, each through the segments and the kernel on
    its own thread, the kernel's GIL released) against the same step in one lane (the kernel on 2 threads):
    the same logits, evidence trace and cache bytes, to the bit; a one-row step is not cut. The served
    loop's lanes: tests/core/test_decode_graph.py's batched requests against their solo tokens."""
    sh = split.shape
    layers, calib = list(range(sh.layers)), smol.calibration_ids()
    one, two = (SplitDecoderSession(smol.model, "w8a8", layers, split.kernel, lanes=n, attention_threads=2,
                                    calibration_ids=calib) for n in (1, 2))
    rng = np.random.default_rng(4)
    pasts = np.array([10, 40, 3, 25, 60], np.int32)
    B, C, S = len(pasts), 64, int(pasts.max()) + 1
    ids = rng.integers(0, sh.vocab, (B, 1)).astype(np.int64)
    bias = np.zeros((B, 1, 1, S), np.float32)
    bias[:, :, :, :4] = np.log(0.3)  # a chunk's prior on the first columns
    caches = [rng.integers(-60, 61, (2, B, sh.kv_heads, C, sh.head_dim)).astype(np.int8) for _ in layers]
    got = []
    for session in (one, two):
        keys, values = [c[0].copy() for c in caches], [c[1].copy() for c in caches]
        bound = session.bind(keys, values, B, 1)
        assert [(lo, hi) for lo, hi, _ in bound.lanes] == ([] if session is one else [(0, 2), (2, 5)])
        out = bound.run(ids, pasts[:, None].astype(np.int64), pasts, bias, None)
        got.append((out["logits"].copy(), out["attn"].copy(), keys, values))
    (l1, a1, k1, v1), (l2, a2, k2, v2) = got
    assert np.array_equal(l1, l2) and np.array_equal(a1, a2)
    assert all(np.array_equal(x, y) for x, y in zip(k1 + v1, k2 + v2))
    assert not np.array_equal(k1[0], caches[0][0])  # the step wrote its new columns
    assert two.bind([k[:1] for k in k2], [v[:1] for v in v2], 1, 1).lanes == []
    with pytest.raises(ValueError, match="releases the GIL runs on one thread"):
        split.kernel.attend_raw(1, 1, 9, 3, C, 64, S, *([0] * 12), 1.0, 2, release_gil=True)


def test_the_loop_steps_in_lanes_unless_work_beside_it_takes_a_core(smol, split, monkeypatch):
    """The decode loop asks each step for its lanes, except while `occupied` (a request's retrieval and
    layout, a generation in torch, on their own threads) is held: then every step runs on the decode thread
    alone; the same tokens either way."""
    laned: list[bool] = []
    real = SplitBound.run

    def run(self, *a, **kw):
        if "laned" in kw:  # decode steps (a prefill's run is never cut)
            laned.append(kw["laned"])
        return real(self, *a, **kw)

    monkeypatch.setattr(SplitBound, "run", run)
    loop = DecodeLoop(split, smol.eos_ids, smol.tokenizer)
    prompts = [smol.layout(prompt=p)[1] for p in ("The capital of France is", "Attention is a soft", "One, two,")]

    def tokens() -> list[list[int]]:
        with loop.paused():  # the three join together
            its = [loop.submit(job_for(ids, None, Sampling(max_tokens=4, ignore_eos=True))) for ids in prompts]
        return [list(it)[-1].token_ids for it in its]  # each job's Generation

    try:
        free = tokens()
        assert laned and all(laned)
        laned.clear()
        with loop.occupied():
            assert loop._occupied == 1
            busy = tokens()
        assert laned and not any(laned) and loop._occupied == 0
        assert busy == free
    finally:
        loop.close()
