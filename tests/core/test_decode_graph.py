"""The decode graph (softknn.generate) against its references: the 4-bit blocks against their plain
dequantisation; joint mixing with memory in the KV cache against the unmodified model on the masked
concatenation (and, with the k-NN prior, against the memory hook); batched decoding against each
request's solo run; cancellation and refusals."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
import torch

from softknn.common.errors import InvalidInput
from softknn.generate.attention import Trace, place_memory
from softknn.generate.batch import (
    DecodeLoop,
    KVCache,
    PackedMemory,
    _need,
    _trace_step,
    _trace_step_reference,
    _trace_token_mass,
    decoder_session,
    job_for,
    pack_chunks,
    pack_memory,
    quantize_kv,
)
from softknn.generate.graph import lossless_q4, resolve_weights
from softknn.generate.model import Generation, Generator, Sampling, choose_token
from softknn.generate.quant import (
    dequantize_q4,
    dequantize_w8,
    is_lossless,
    pack_q4,
    pack_q8_as_two_q4,
    pack_w8,
    w8a8_matmul,
)
from softknn.generate.runtime import DecoderSession, SplitDecoderSession
from tests.core.test_generator import CHUNKS, PROMPTS, _memory, _tiny
from tests.numerics import close


def _gen(it) -> Generation:
    *_, last = it
    assert isinstance(last, Generation)
    return last


# fp32 multiplies the model's float32 weights in another order than torch; q4 the same numbers block by
# block (Σ_i q·x, then ·d, then the minimum's term): its float32 rounding reaches ~1.1e-4 on SmolLM2
TOL = {"fp32": 1e-4, "q4": 3e-4}


def _all_close(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-4) -> bool:
    """Every logit of every step |a − b| ≤ tol·max(1, |b|) (tests.numerics.close, vectorised)."""
    assert len(a) == len(b)
    return all(bool(((x - y).abs() <= tol * y.abs().clamp(min=1.0)).all()) for x, y in zip(a, b, strict=True))


# --- the 4-bit blocks ---------------------------------------------------------------------------------
def test_q4_blocks_hold_a_q4_1_weight_exactly_and_round_any_other_to_half_a_step():
    rng = np.random.default_rng(0)
    d = rng.uniform(1e-3, 1e-2, (8, 4)).astype(np.float32)
    m = rng.uniform(-0.1, 0.0, (8, 4)).astype(np.float32)
    q = rng.integers(0, 16, (8, 4, 32))
    q[..., 0], q[..., 1] = 0, 15  # a Q4_1 block holds its minimum at code 0 and its maximum at 15
    w = (d[..., None] * q + m[..., None]).reshape(8, 128).astype(np.float32)
    p = pack_q4(w)
    assert p.codes.shape == (8, 4, 16) and p.codes.dtype == np.uint8
    assert is_lossless(w, [p])  # the same numbers, up to float32 rounding of d·q + m
    other = rng.standard_normal((8, 128)).astype(np.float32)
    po = pack_q4(other)
    err = np.abs(other - dequantize_q4(po)).reshape(8, 4, 32).max(-1)
    assert (err <= po.scales / 2 + 1e-6).all() and err.max() > 0


def test_q8_blocks_split_into_two_exact_4_bit_planes():
    rng = np.random.default_rng(1)
    d = rng.uniform(1e-3, 1e-2, (6, 2)).astype(np.float32)
    q8 = rng.integers(-127, 128, (6, 2, 32))
    q8[..., 0] = 127  # the block's largest magnitude sets d = max|w|/127
    w = (d[..., None] * q8).reshape(6, 64).astype(np.float32)
    hi, lo = pack_q8_as_two_q4(w)
    assert is_lossless(w, [hi, lo]) and not is_lossless(w + 1e-4, [hi, lo])
    assert np.allclose(hi.scales, 16 * lo.scales) and np.allclose(hi.mins, -128 * lo.scales)


def test_the_packaged_model_runs_its_own_gguf_numbers_in_q4(smol):
    assert lossless_q4(smol.model) and resolve_weights(smol.model, "auto") == "w8a8"


def _one_linear(weights: str, w: np.ndarray, rounding: str = "blocks"):
    """An ORT session of the decode graph's linear alone (x (M, K) → y (M, N)) in `weights` format."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from softknn.generate.graph import OPSET, _Builder, _Linear

    b = _Builder()
    y = _Linear(b, weights, rounding)("x", w, "lin", rank=2)
    b.nodes.append(helper.make_node("Identity", [y], ["y"]))
    n, k = w.shape
    g = helper.make_graph(b.nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_w8_channels_round_each_weight_to_half_a_step_of_its_rows_scale():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 96)).astype(np.float32) * rng.uniform(0.01, 3, (16, 1)).astype(np.float32)
    w[3] = 0  # an all-zero channel: codes 0, any scale
    wq, sw = pack_w8(w)
    assert wq.dtype == np.int8 and sw.shape == (16,) and np.abs(wq).max() == 127
    err = np.abs(w - dequantize_w8(wq, sw)).max(-1)
    assert (err <= sw / 2 + 1e-7).all() and err.max() > 0 and not wq[3].any()


def _vnni() -> bool:
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    return " avx512_vnni" in flags or " avx_vnni" in flags


def test_the_w8a8_linear_is_its_plain_reference_and_a_row_does_not_depend_on_the_others():
    """The graph's w8a8 linear (ONNX Runtime's int8 GEMM) against the numpy reference, row by row: the
    integer products are exact, so a row's output is the same alone and in a batch of 16 (what makes
    batched decoding give each request its solo tokens), and within float32 rounding of the reference."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((200, 576)).astype(np.float32) * 0.05
    x = rng.standard_normal((16, 576)).astype(np.float32)
    x[2] *= 40  # rows of very different scales share the batch
    x[5, 7] = 300.0  # an outlier sets its own row's scale only
    x[9] = 0.0
    s = _one_linear("w8a8", w)
    batch = s.run(None, {"x": x})[0]
    ref = w8a8_matmul(x, *pack_w8(w))
    # without VNNI a pair of products may saturate at int16 (pack_w8): within 1% there, exact with it
    tol = 1e-6 if _vnni() else 1e-2
    assert np.abs(batch - ref).max() <= tol * np.abs(ref).max() and not batch[9].any()
    for i in (0, 2, 5):
        assert np.array_equal(s.run(None, {"x": x[i : i + 1]})[0][0], batch[i])
    exact = x @ w.T  # int8 on both sides: ≤ 1.1% of the product's scale off float32 (measured)
    rel = np.abs(ref - exact).max(-1) / np.abs(exact).max(-1).clip(1e-9)
    assert rel[[0, 1, 2, 3]].max() <= 0.02 and rel[5] > rel[[0, 1, 2, 3]].max()


def test_the_w8a8_activation_codes_round_half_to_even_as_the_reference_ties_included():
    """The graph rounds each row to its codes in one QuantizeLinear (x / sx, half to even, + 128); its
    reference rounding (`ops`: Div, Round, Add, Cast) gives the same outputs to the bit, and both the
    codes of np.rint, on rows whose values are exact halfway cases x / sx = k + 0.5 (and rows of
    ordinary values, an all-zero row). With W = I (codes 127, scale 1/127) each output is its code
    times sx, to within float32 rounding of the scales' product: the codes are read back exactly."""
    rng = np.random.default_rng(5)
    k = 96
    x = rng.standard_normal((8, k)).astype(np.float32)
    ties = 0
    for r in range(4):  # rows of ties: amax fixed, the others at (c + 0.5)·sx where that is exact in float32
        amax = np.float32(rng.uniform(0.5, 40))
        sx = np.maximum(amax * np.float32(1 / 127), np.float32(1e-30))
        codes = rng.integers(-126, 126, k).astype(np.float32) + np.float32(0.5)
        row = (codes * sx).astype(np.float32)
        exact = (row / sx == codes) & (np.abs(row) < amax)
        row[~exact] = rng.uniform(-amax, amax, int((~exact).sum())).astype(np.float32) * np.float32(0.99)
        row[0] = amax
        x[r] = row
        ties += int(exact[1:].sum())
    x[7] = 0.0
    assert ties >= 150  # most of them are exact halfway cases
    w = np.eye(k, dtype=np.float32)
    got = _one_linear("w8a8", w).run(None, {"x": x})[0]
    assert np.array_equal(got, _one_linear("w8a8", w, "ops").run(None, {"x": x})[0])
    sx = np.maximum(np.abs(x).max(-1, keepdims=True) * np.float32(1 / 127), np.float32(1e-30))
    want = np.rint(x / sx)  # numpy: halfway cases to even
    assert np.array_equal(np.rint(got / sx), want) and np.abs(want).max() == 127
    assert np.allclose(got, w8a8_matmul(x, *pack_w8(w)), rtol=1e-6, atol=0) and not got[7].any()


@pytest.mark.parametrize("weights", ["w8a8", "fp32"])
def test_products_that_share_their_input_are_the_wide_products_parts(weights):
    """The MLP's gate and up as two products of h (w8a8 rounds h's rows once for both, _Linear.many), not
    one product over the stacked weights split afterwards: the same numbers (to the bit for w8a8, whose
    output channels each have their own weight row and scale), a bias added to each."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from softknn.generate.graph import OPSET, _Builder, _Linear

    rng = np.random.default_rng(6)
    w = rng.standard_normal((40, 64)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32) * np.float32(3)

    def session(build):
        b = _Builder()
        outs = build(b, _Linear(b, weights))
        for i, y in enumerate(outs):
            b.nodes.append(helper.make_node("Identity", [y], [f"y{i}"]))
        g = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 64])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(outs))],
                              b.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})

    wide = session(lambda b, lin: [lin("x", w, "wide", bias, rank=2)])[0]
    parts = session(lambda b, lin: lin.many("x", [w[:25], w[25:]], "parts", [bias[:25], bias[25:]], rank=2))
    assert [p.shape for p in parts] == [(5, 25), (5, 15)]
    if weights == "w8a8":
        assert np.array_equal(np.concatenate(parts, axis=1), wide)
    else:
        assert np.allclose(np.concatenate(parts, axis=1), wide, rtol=1e-6, atol=1e-5)


def test_smoothing_moves_an_outlier_channel_into_the_weights_and_keeps_the_product():
    """SmoothQuant's factors: dividing the inputs by s and multiplying the weight's columns by s is the same
    product (float32 rounding), and with an outlier input channel the w8a8 error falls."""
    from softknn.generate.quant import smoothing

    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 256)).astype(np.float32) * 0.05
    x = rng.standard_normal((32, 256)).astype(np.float32)
    x[:, 17] *= 80  # a channel every token carries large: the per-token scale is its
    s = smoothing(np.abs(x).max(0), w)
    assert s.shape == (256,) and s[17] == s.max()
    assert np.allclose((x / s) @ (w * s).T, x @ w.T, rtol=1e-4, atol=1e-4)
    exact = x @ w.T
    plain, smoothed = w8a8_matmul(x, *pack_w8(w)), w8a8_matmul(x / s, *pack_w8(w * s))
    assert np.abs(smoothed - exact).max() < 0.5 * np.abs(plain - exact).max()


# --- joint in the KV cache = the masked concatenation ------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> Generator:
    return Generator.load()


@pytest.fixture(scope="module")
def sessions(smol) -> dict[str, DecoderSession]:
    return {w: DecoderSession(smol.model, w, list(range(smol.info.num_layers))) for w in ("fp32", "q4")}


@pytest.fixture(scope="module")
def int8(smol) -> DecoderSession:
    """The served weights (q4) with the int8 KV cache."""
    return DecoderSession(smol.model, "q4", list(range(smol.info.num_layers)), kv="int8",
                          calibration_ids=smol.calibration_ids())


@pytest.fixture(scope="module")
def w8(smol) -> DecoderSession:
    """w8a8 weights with the int8 KV cache (the served default)."""
    return DecoderSession(smol.model, "w8a8", list(range(smol.info.num_layers)), kv="int8",
                          calibration_ids=smol.calibration_ids())


@pytest.fixture(scope="module", params=["fp32", "q4"])
def loop(request, smol, sessions) -> DecodeLoop:
    """Every step of one weight format (prefills included)."""
    loop = DecodeLoop(sessions[request.param], smol.eos_ids, smol.tokenizer, max_batch=8)
    yield loop
    loop.close()


def _served(smol, sessions, **kw) -> DecodeLoop:
    """The loop as decode_loop serves a GGUF model: q4 for every step, prefill chunks and batches."""
    return DecodeLoop(sessions["q4"], smol.eos_ids, smol.tokenizer, **kw)


@pytest.mark.parametrize("k", [1, 8])
def test_joint_in_the_kv_cache_equals_the_masked_concatenation_on_smollm2(loop, smol, k):
    """Raw prompts (each chunk sees only itself) and chat prompts (the chunks encoded after the
    conversation's head, whose rows face no memory), both placements: the same greedy tokens and
    logits within 1e-4 (relative above 1) of the unmodified model on the masked concatenation."""
    for i, question in enumerate(PROMPTS[:2]):
        positions = ("composite", "reordered")[(i + k) % 2]
        for prefix, rest in ([], smol.layout(prompt=question)[1]), smol.layout(messages=[{"role": "user", "content": question}]):
            ids, mem = _memory(smol, k, positions, prefix)
            got = _gen(loop.submit(job_for(prefix + rest, mem, Sampling(max_tokens=4), keep_logits=True)))
            ref = smol.generate_masked_reference(ids, prefix + rest, positions, Sampling(max_tokens=4),
                                                 prefix_len=len(prefix))
            assert got.token_ids == ref.token_ids
            assert _all_close(got.logits, ref.logits, TOL[loop.session.weights]), (loop.session.weights, k, positions, bool(prefix))


@pytest.mark.parametrize("prior", [1.0, 4.0])
def test_the_knn_prior_in_the_mask_equals_the_memory_hook(loop, smol, prior):
    prefix, rest = smol.layout(messages=[{"role": "user", "content": PROMPTS[2]}])
    _, mem = _memory(smol, 4, "composite", prefix)
    s = Sampling(max_tokens=4)
    got = _gen(loop.submit(job_for(prefix + rest, mem, s, prior=prior, keep_logits=True)))
    ref = smol.run(prefix + rest, mem, sampling=s, mixing="joint", prior=prior, keep_logits=True)
    assert got.token_ids == ref.token_ids and _all_close(got.logits, ref.logits, TOL[loop.session.weights])
    # the evidence trace: the memory mass per chunk of every token, as the hook records it
    assert all(close(float(a), float(b), 1e-5) for x, y in zip(got.trace.mass, ref.trace.mass, strict=True)
               for a, b in zip(x, y, strict=True))
    assert torch.allclose(got.trace.token_mass, ref.trace.token_mass, atol=1e-5)


def test_without_memory_the_graph_is_the_plain_model(loop, smol):
    prompt = sum(smol.layout(messages=[{"role": "user", "content": PROMPTS[3]}]), [])
    s = Sampling(max_tokens=6)
    got = _gen(loop.submit(job_for(prompt, None, s, keep_logits=True)))
    ref = smol.run(prompt, None, sampling=s, keep_logits=True)
    assert got.token_ids == ref.token_ids and _all_close(got.logits, ref.logits, TOL[loop.session.weights])
    assert got.trace is None


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_the_graph_covers_grouped_multi_query_heads_and_qkv_biases(smol, family):
    tiny = _tiny(family, smol.tokenizer)
    loop = DecodeLoop(DecoderSession(tiny.model, "fp32", [1, 2]), tiny.eos_ids, tiny.tokenizer)
    try:
        for k in (1, 4):
            ids, mem = _memory(tiny, k, "composite", layers=[1, 2])
            prompt = tiny.layout(prompt=PROMPTS[k % len(PROMPTS)])[1]
            got = _gen(loop.submit(job_for(prompt, mem, Sampling(max_tokens=5), keep_logits=True)))
            ref = tiny.run(prompt, mem, sampling=Sampling(max_tokens=5), mixing="joint", keep_logits=True)
            assert got.token_ids == ref.token_ids and _all_close(got.logits, ref.logits), (family, k)
    finally:
        loop.close()


@pytest.mark.parametrize(("positions", "encoded_after"), [("composite", 5), ("reordered", 5), ("composite", 2)])
def test_packing_chunks_directly_equals_packing_the_placed_memory(smol, positions, encoded_after):
    """pack_chunks (the engine's path: no padded copy, only moved keys rotated) against pack_memory of
    place_memory (the torch path's form), bit for bit: columns, the prior, the prompt's layout."""
    layers = smol.layers("all")
    ids = [smol.memory_ids(t) for t in CHUNKS[:3]]
    kv = [torch.from_numpy(x) for x in smol.chunk_kv(ids, layers, prefix=[])]
    w = torch.softmax(torch.tensor([1.0, 0.2, -0.5]), 0)
    got = pack_chunks(kv, layers, w, 4.0, positions, smol.inv_freq, encoded_after=encoded_after, prefix_len=5)
    want = pack_memory(place_memory(kv, layers, w, positions, smol.inv_freq, encoded_after=encoded_after,
                                    prefix_len=5), 4.0)
    assert got.layers == want.layers and got.lengths == want.lengths == [len(x) for x in ids]
    assert (got.prefix_len, got.prompt_start) == (want.prefix_len, want.prompt_start)
    assert all(np.array_equal(a, b) for a, b in zip(got.kv, want.kv, strict=True))
    assert np.array_equal(got.bias, want.bias) and np.array_equal(got.chunk, want.chunk)
    moved = positions == "reordered" or encoded_after != 5  # encoded after another prefix: rotated; else the store's own
    assert np.array_equal(got.kv[1][:, :, 0], kv[1][:, :, 0].numpy()) != moved


# --- the int8 KV cache -------------------------------------------------------------------------------
def _prefill(session: DecoderSession, prompt: list[int]) -> KVCache:
    """One prefill of `prompt` (no memory) into a fresh cache of the session's format."""
    sh, T = session.shape, len(prompt)
    cache = KVCache(sh.layers, sh.kv_heads, sh.head_dim, session.kv_scales)
    cache.ensure(1, T, 0)
    bias = np.zeros((1, 1, T, T), dtype=np.float32)  # the kernel is causal among the new tokens
    session.run(np.array([prompt]), np.arange(T)[None], np.array([T - 1]), bias,
                bias if session.has_plain_bias else None, cache.keys, cache.values)
    return cache


def test_the_int8_cache_holds_each_key_and_value_rounded_by_its_layer_and_channel_scale(smol, sessions, int8):
    """Layer 0's keys and values depend on the tokens alone, so the float32 cache holds exactly what the
    int8 one rounds: ONNX Runtime's writes are quantize_kv of them with layer 0's scale of each channel (the
    scales wired to the right layer and channel, and place()'s rounding the kernel's own), off by one
    step at most where float32 division and the kernel's multiply round a half differently."""
    prompt = sum(smol.layout(messages=[{"role": "user", "content": PROMPTS[0]}]), [])
    T = len(prompt)
    f32, q8 = _prefill(sessions["q4"], prompt), _prefill(int8, prompt)
    assert q8.keys[0].dtype == np.int8 and q8.column_bytes * 4 == f32.column_bytes
    scales = int8.kv_scales
    assert scales is not None and scales.shape == (smol.info.num_layers, 2, 3, 64)
    assert len(np.unique(scales[0, 0])) > 64  # a scale per channel, not one per layer
    for j, (got, ref) in enumerate(((q8.keys[0], f32.keys[0]), (q8.values[0], f32.values[0]))):
        want = quantize_kv(ref[0, :, :T], scales[0, j][:, None, :])
        diff = np.abs(got[0, :, :T].astype(np.int32) - want)
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.999, (j, diff.max(), (diff == 0).mean())
        assert np.abs(want).max() <= 127 and (want != 0).mean() > 0.9  # the scales use the int8 range


def test_memory_is_quantised_on_the_callers_thread_and_placed_as_each_chunk_token_rounded(smol, int8, monkeypatch):
    """DecodeLoop.submit lays R out for an int8 cache on the request's own thread (KVCache.layout), so
    the loop's thread, which every running request waits on, only copies it, and the job drops its float
    rows. Column o_c + t of memory
    layer j holds chunk c's token t quantised with that layer's key or value scale, and a row placed from
    it holds the bytes of a row placed without it."""
    prompt, gm, _, prior = _requests(smol)[2]  # k 8, composite
    mem = pack_memory(gm, prior)
    sh = int8.shape
    cache = KVCache(sh.layers, sh.kv_heads, sh.head_dim, int8.kv_scales)
    laid: list = []
    worker = threading.Thread(target=lambda: laid.append(cache.layout(mem)))
    worker.start()
    worker.join()
    keys, values = laid[0]
    assert keys.dtype == np.int8 and keys.shape == (len(mem.layers), sh.kv_heads, mem.columns, sh.head_dim)
    scales = int8.kv_scales
    starts = np.cumsum([0, *mem.lengths])
    for c, kv in enumerate(mem.kv):
        for t in (0, kv.shape[0] - 1):
            for j, li in enumerate(mem.layers):
                assert np.array_equal(keys[j, :, starts[c] + t], quantize_kv(kv[t, j, 0], scales[li, 0]))
                assert np.array_equal(values[j, :, starts[c] + t], quantize_kv(kv[t, j, 1], scales[li, 1]))
    cache.ensure(2, mem.columns + 8, 0)
    assert cache.place(0, mem) == cache.place(1, mem, [laid[0]]) == mem.columns  # one piece: the whole memory
    for a in cache.keys + cache.values:
        assert np.array_equal(a[0], a[1])
    assert np.array_equal(cache.bias[0], cache.bias[1])

    threads: list[str] = []
    layout = KVCache.layout
    monkeypatch.setattr(KVCache, "layout", lambda self, m: threads.append(threading.current_thread().name) or layout(self, m))
    loop = DecodeLoop(int8, smol.eos_ids, smol.tokenizer)
    try:
        job = job_for(prompt, mem, Sampling(max_tokens=2))
        it = loop.submit(job)
        # the job keeps the int8 copy only; the caller's PackedMemory is not touched (it may let it go)
        assert job.memory is not None and job.memory.kv == [] and len(mem.kv) == len(mem.lengths)
        assert _gen(it).token_ids and job.laid is None  # the row held it; the job lets it go
    finally:
        loop.close()
    assert threads == [threading.current_thread().name]


def test_the_int8_cache_keeps_the_float_caches_attention_and_logits(smol, sessions, int8):
    """With memory (k 4, β 4, chat prompts): the evidence trace within 0.01 of the float32 cache's and
    the first step's logits, up to a common shift, within 3% of their spread (measured: ≤ 1.9%, from
    rounding ~1% of each key and value; q4a8's int8 activations move them 4-6%; scales 0.8× too small,
    clipping, move them 5-8%), so the first token is one the float32 cache scores as high, within that.
    Its effect on answers: bench/results/gen_quality_kv.json."""
    _first_steps_agree(smol, sessions["q4"], int8, logits=0.03, trace=0.01)


def _first_steps_agree(smol, ref_session: DecoderSession, session: DecoderSession, *, logits: float, trace: float):
    """With memory (k 4, β 4), three chat prompts: `session`'s first step against `ref_session`'s, the logits
    up to a common shift within `logits` of their spread, its first token one the reference scores as high
    within that, and the evidence trace within `trace`."""
    ref = DecodeLoop(ref_session, smol.eos_ids, smol.tokenizer)
    got = DecodeLoop(session, smol.eos_ids, smol.tokenizer)
    try:
        for q in PROMPTS[:3]:
            prefix, rest = smol.layout(messages=[{"role": "user", "content": q}])
            _, mem = _memory(smol, 4, "composite", prefix)
            a, b = (_gen(lp.submit(job_for(prefix + rest, mem, Sampling(max_tokens=1), prior=4.0, keep_logits=True)))
                    for lp in (ref, got))
            x, y = a.logits[0], b.logits[0]
            d, spread = x - y, float(x.max() - x.min())
            assert float((d - d.mean()).abs().max()) <= logits * spread, q
            assert float(x.max() - x[b.token_ids[0]]) <= logits * spread, q
            assert np.abs(np.array(a.trace.mass[0]) - np.array(b.trace.mass[0])).max() <= trace, q
    finally:
        ref.close()
        got.close()


@pytest.mark.parametrize("weights", ["q4a8", "w8a8"])
def test_int8_activations_keep_the_float_graphs_attention_and_logits(smol, sessions, w8, weights):
    """Int8 activations (q4a8: per block of 32; w8a8: per token, with int8 weights per channel) with the int8
    cache against the float32 graph and cache, with memory (k 4, β 4): the first step's logits, up to a
    common shift, within 8% of their spread (measured: q4a8 4.0-5.1%, w8a8 4.3-5.3%) and the first token
    one the float32 graph scores as high, within that; the evidence trace within 0.02 (measured ≤ 0.004).
    Their effect on answers: bench/results/gen_quality_wformats.json."""
    session = w8 if weights == "w8a8" else DecoderSession(smol.model, weights, list(range(smol.info.num_layers)),
                                                          kv="int8", calibration_ids=smol.calibration_ids())
    _first_steps_agree(smol, sessions["fp32"], session, logits=0.08, trace=0.02)


# --- continuous batching ----------------------------------------------------------------------------
def _requests(smol) -> list:
    """Four different requests: their own R (k 1…8, both placements), questions and lengths."""
    out = []
    for i, (k, positions) in enumerate([(1, "composite"), (4, "reordered"), (8, "composite"), (2, "composite")]):
        prefix, rest = smol.layout(messages=[{"role": "user", "content": PROMPTS[i]}])
        _, mem = _memory(smol, k, positions, prefix)
        out.append((prefix + rest, mem, Sampling(max_tokens=4 + 3 * i), 4.0 * (i % 2)))
    return out


@pytest.mark.parametrize("kv", ["fp32", "int8", "w8a8", "kernel"])
def test_batched_decoding_gives_each_request_the_tokens_of_its_solo_greedy_run(smol, sessions, int8, w8, kv):
    """q4 weights with either cache, w8a8 weights (per-token int8 activations) with the int8 cache, and w8a8
    with the attention in the C kernel between the graph's segments (what a server runs by default: the
    three waiting prompts prefilled in one run, rows padded; the same logits to the bit)."""
    session = {"int8": int8, "w8a8": w8}.get(kv)
    if kv == "kernel":
        session = decoder_session(smol, "w8a8", list(range(smol.info.num_layers)), kv="int8", attention="kernel")
        assert isinstance(session, SplitDecoderSession)
    loop = _served(smol, sessions, max_batch=8) if session is None else DecodeLoop(session, smol.eos_ids,
                                                                                  smol.tokenizer, max_batch=8)
    try:
        reqs = _requests(smol)
        solo = [_gen(loop.submit(job_for(p, m, s, prior=b, keep_logits=True))) for p, m, s, b in reqs]
        assert loop.max_running == 1
        with loop.paused():  # all four wait, then run as one batch of 4 that shrinks as each ends
            its = [loop.submit(job_for(p, m, s, prior=b, keep_logits=True)) for p, m, s, b in reqs[:3]]
            late = []
        first = next(its[0])  # the batch of three is decoding; the fourth joins it mid-way
        late.append(loop.submit(job_for(*reqs[3][:3], prior=reqs[3][3], keep_logits=True)))
        together = [_gen([first, *its[0]])] + [_gen(it) for it in its[1:]] + [_gen(late[0])]
        assert loop.max_running >= 3
        assert loop.max_prefilled_together == (3 if kv == "kernel" else 0)
        for a, b in zip(together, solo, strict=True):
            assert a.token_ids == b.token_ids and a.text == b.text
            # a batch of B rows sums in another order (~1e-5); an int8 cache then rounds the odd new key or
            # value that lands near a half the other way, one step of its channel's scale, and those steps
            # add up over the tokens: measured ≤ 7e-2 by the 13th token, the tokens themselves the same.
            # The kernel computes each row on its own, in one order whatever the batch: to the bit
            tol = {"fp32": TOL["q4"], "kernel": 0.0}.get(kv, 0.15)
            assert _all_close(a.logits, b.logits, tol)
    finally:
        loop.close()


def test_prompts_a_run_left_out_go_together_in_the_next_round_not_one_run_each(smol):
    """Four prompts waiting, a round's budget fitting the first two and half the third: the two go in one
    run; the third does not begin alone in what is left (a pass over the weights for a few tokens) but goes
    with the fourth in the next round's run: two prefill runs in all, each request its solo tokens. The loop
    thread takes the first job before the others are submitted: what came while paused joins the round."""
    session = decoder_session(smol, "w8a8", list(range(smol.info.num_layers)), kv="int8", attention="kernel")
    loop = DecodeLoop(session, smol.eos_ids, smol.tokenizer, max_batch=8)
    try:
        reqs = _requests(smol)
        solo = [_gen(loop.submit(job_for(p, m, s, prior=b))) for p, m, s, b in reqs]  # the prefix kept too
        jobs = [job_for(p, m, s, prior=b) for p, m, s, b in reqs]
        rest = [loop._rest(j) for j in jobs]
        assert rest[2] >= 2 and rest[2] + rest[3] <= rest[0] + rest[1] + rest[2] // 2
        loop.prefill_chunk = rest[0] + rest[1] + rest[2] // 2
        runs = loop.prefill_runs
        with loop.paused():
            its = [loop.submit(jobs[0])]
            time.sleep(0.1)  # the loop's thread takes the first job from its inbox before the others come
            its += [loop.submit(j) for j in jobs[1:]]
        got = [_gen(it) for it in its]
        assert loop.prefill_runs - runs == 2 and loop.max_prefilled_together == 2
        assert [g.token_ids for g in got] == [g.token_ids for g in solo]
    finally:
        loop.close()


def test_a_steps_tokens_reach_their_requests_after_every_row_has_chosen_its_own(smol, sessions):
    """A put wakes its request's thread, which then asks for the GIL beside the rows still being chosen:
    the step's Steps (and the Generation of a row that ends there) are put once every row has its token,
    in each request's order. Four requests decoding together: at every put inside a step, all its rows
    were done; each request gets its solo tokens."""
    loop = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer)
    seen: list[tuple[int, int]] = []  # (rows chosen so far in the step, rows in the step) at each put
    state = {"in_step": False, "chosen": 0, "rows": 0}
    real_step, real_emit = loop._step, loop._emit

    def step():
        state.update(in_step=True, chosen=0, rows=len(loop.running))
        try:
            real_step()
        finally:
            state["in_step"] = False

    def emit(*a, **kw):
        state["chosen"] += 1
        return real_emit(*a, **kw)

    class Recording(queue.Queue):
        def put(self, item, *a, **kw):
            if state["in_step"]:
                seen.append((state["chosen"], state["rows"]))
            super().put(item, *a, **kw)

    loop._step, loop._emit = step, emit
    try:
        reqs = _requests(smol)
        solo = [_gen(loop.submit(job_for(p, m, s, prior=b))) for p, m, s, b in reqs]
        seen.clear()
        jobs = [job_for(p, m, s, prior=b) for p, m, s, b in reqs]
        for j in jobs:
            j.out = Recording()
        with loop.paused():
            its = [loop.submit(j) for j in jobs]
        got = [_gen(it) for it in its]
        assert [g.token_ids for g in got] == [g.token_ids for g in solo]
        assert max(rows for _, rows in seen) >= 2
        assert all(chosen == rows for chosen, rows in seen), [x for x in seen if x[0] != x[1]][:5]
    finally:
        loop.close()


def test_prompts_prefilled_in_chunks_between_decode_steps_give_the_tokens_of_whole_prefills(smol, sessions):
    """Chunks of 7 prompt tokens (the chat template's prefix, facing no memory, split across chunks), each
    chunk run between two decode steps of the requests already running: every request gets the tokens of
    its solo run with its whole prompt in one prefill."""
    whole = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer, prefill_chunk=4096)
    chunked = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer, prefill_chunk=7)
    try:
        reqs = _requests(smol)
        solo = [_gen(whole.submit(job_for(p, m, s, prior=b, keep_logits=True))) for p, m, s, b in reqs]
        with chunked.paused():
            its = [chunked.submit(job_for(p, m, s, prior=b, keep_logits=True)) for p, m, s, b in reqs]
        together = [_gen(it) for it in its]
        assert chunked.max_running >= 2
        for a, b in zip(together, solo, strict=True):
            assert a.token_ids == b.token_ids
            assert _all_close(a.logits, b.logits, TOL["fp32"])
    finally:
        whole.close()
        chunked.close()


def test_requests_wait_for_cache_room_and_get_their_solo_tokens(smol, sessions):
    """A budget of cache columns: the four requests need 60–1,080 columns each; with room for about the two
    largest at once, the others wait their turn (never more reserved than the budget), and each gets the
    tokens of its solo run."""
    reqs = _requests(smol)
    free = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer)
    needs = [_need(job_for(p, m, s, prior=b)) for p, m, s, b in reqs]
    column_mb = free.cache.column_bytes / 2**20
    tight = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer, cache_mb=(sorted(needs)[-1] + sorted(needs)[-2])
                       * column_mb)
    seen = []
    real = tight._step

    def step():
        seen.append(tight.reserved)
        real()

    tight._step = step
    try:
        solo = [_gen(free.submit(job_for(p, m, s, prior=b))) for p, m, s, b in reqs]
        with tight.paused():
            its = [tight.submit(job_for(p, m, s, prior=b)) for p, m, s, b in reqs]
        together = [_gen(it) for it in its]
        assert max(seen) <= tight.budget and tight.max_running < len(reqs) and tight.reserved == 0
        assert [g.token_ids for g in together] == [g.token_ids for g in solo]
        with pytest.raises(InvalidInput) as e:  # more than the whole cache: refused before it waits
            tight.submit(job_for(reqs[2][0], reqs[2][1], Sampling(max_tokens=tight.budget)))
        assert e.value.field == "max_tokens" and "SOFTKNN_GENERATOR__CACHE_MB" in str(e.value)
    finally:
        free.close()
        tight.close()


def test_the_trace_step_in_numpy_is_the_per_chunk_loop():
    """_trace_step (bincount and a running sum per column, every row at every step; the token mass laid
    out once at the end) against _trace_step_reference (the per-chunk loop in torch): the same chunk
    mass, shares, token mass (to the bit) and entropy over several steps, chunks of different lengths,
    and a step that gives the memory no mass at all."""
    rng = np.random.default_rng(3)
    lengths = [5, 1, 9, 3]
    chunk = np.repeat(np.arange(len(lengths)), lengths)
    mem = PackedMemory([], [0], np.zeros(chunk.shape[0], np.float32), chunk, lengths, 0, 0)
    fast, ref = Trace(), Trace()
    rows = [rng.random(chunk.shape[0]).astype(np.float32) * 0.1 for _ in range(3)] + [np.zeros(chunk.shape[0], np.float32)]
    columns = None
    for a in rows:
        columns = _trace_step(fast, a, mem, columns)
        _trace_step_reference(ref, a, mem)
    assert fast.token_mass is None  # laid out once, when the row ends
    _trace_token_mass(fast, columns, mem)
    for got, want in ((fast.mass, ref.mass), (fast.share, ref.share)):
        assert all(torch.allclose(g, w, rtol=1e-6, atol=1e-9) for g, w in zip(got, want, strict=True))
    assert fast.token_mass is not None and ref.token_mass is not None
    assert torch.equal(fast.token_mass, ref.token_mass) and fast.token_mass[1, 1:].abs().sum() == 0
    assert np.allclose(fast.attention_entropy, ref.attention_entropy, rtol=1e-5) and fast.attention_entropy[-1] == 0.0


def test_the_batchs_argmax_is_each_rows_greedy_choice_ties_to_the_first():
    """The decode step takes the argmax of every row's logits in one call; temperature 0 uses it in
    place of choose_token, which it equals row by row, ties included (the first maximum)."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((6, 997)).astype(np.float32)
    logits[1, [10, 500]] = logits[1].max() + 1.0  # a tie: the first wins
    logits[2, :] = 0.0
    greedy = logits.argmax(axis=1)
    assert greedy[1] == 10 and greedy[2] == 0
    assert list(greedy) == [choose_token(torch.from_numpy(row), Sampling(temperature=0.0), None) for row in logits]


def test_a_released_row_gives_its_pages_back_and_reads_zeros():
    cache = KVCache(2, 3, 64)
    cache.ensure(4, 200, 0)
    for rows in (cache.keys, cache.values):
        for a in rows:
            a[:] = 1.0
    cache.release(2)
    for a in cache.keys + cache.values:
        assert not a[2].any() and (a[1] == 1.0).all() and (a[3] == 1.0).all()


def test_a_prefix_whose_keys_the_loop_keeps_gives_the_tokens_of_a_fresh_prefill(smol, sessions):
    """The chat template's head faces no memory: the second request with it copies the first's keys/values
    for it and prefills only the rest, with the tokens and logits of a loop that never saw it."""
    reqs = [r for r in _requests(smol) if r[1] is not None]
    warm = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer)
    try:
        first = _gen(warm.submit(job_for(reqs[0][0], reqs[0][1], reqs[0][2], prior=reqs[0][3], keep_logits=True)))
        assert warm.prefix_hits == 0 and first.token_ids
        for p, m, s, b in reqs[1:]:
            cold = DecodeLoop(sessions["fp32"], smol.eos_ids, smol.tokenizer)
            try:
                want = _gen(cold.submit(job_for(p, m, s, prior=b, keep_logits=True)))
            finally:
                cold.close()
            got = _gen(warm.submit(job_for(p, m, s, prior=b, keep_logits=True)))
            assert got.token_ids == want.token_ids and _all_close(got.logits, want.logits, TOL["fp32"])
        assert warm.prefix_hits == len(reqs) - 1
    finally:
        warm.close()


def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(smol, sessions):
    loop = _served(smol, sessions)
    try:
        reqs = _requests(smol)
        checks = iter(range(1000))  # the loop asks when it starts the request, at each prefill chunk (one here)
        # and before each step: cancelled at the 5th ask, after three tokens
        with loop.paused():
            keep = loop.submit(job_for(reqs[2][0], reqs[2][1], Sampling(max_tokens=10)))
            gone = loop.submit(job_for(reqs[1][0], reqs[1][1], Sampling(max_tokens=10),
                                       cancelled=lambda: next(checks) >= 4))
        cancelled = _gen(gone)
        assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) == 3
        done = _gen(keep)
        assert done.finish_reason in ("length", "stop") and len(done.token_ids) >= 4 and loop.running == []
    finally:
        loop.close()


def test_a_prompt_past_the_models_positions_is_refused_before_it_runs(smol, loop):
    with pytest.raises(InvalidInput) as e:
        loop.submit(job_for([1] * 10, None, Sampling(max_tokens=smol.model.config.max_position_embeddings)))
    assert e.value.field == "max_tokens"
    with pytest.raises(InvalidInput):
        loop.submit(job_for([], None, Sampling()))


def test_a_step_that_fails_fails_its_requests_and_the_loop_serves_the_next(smol, sessions, monkeypatch):
    loop = _served(smol, sessions)
    try:
        reqs = _requests(smol)
        real = loop._step
        calls = iter(range(1000))

        def broken():
            if next(calls) == 1:  # the second decode step raises
                raise RuntimeError("boom")
            real()

        monkeypatch.setattr(loop, "_step", broken)
        with loop.paused():
            a = loop.submit(job_for(reqs[0][0], reqs[0][1], Sampling(max_tokens=8)))
            b = loop.submit(job_for(reqs[1][0], reqs[1][1], Sampling(max_tokens=8)))
        for it in (a, b):
            with pytest.raises(RuntimeError, match="boom"):
                _gen(it)
        assert loop.running == []
        again = _gen(loop.submit(job_for(reqs[3][0], reqs[3][1], Sampling(max_tokens=3))))
        assert again.finish_reason in ("length", "stop") and again.token_ids
    finally:
        loop.close()


def test_the_graph_file_is_written_once_per_model_config_and_layers_and_reopens_to_the_same_logits(smol, tmp_path):
    """graph_file: one directory per (weights, config, weight format, layers, code), renamed into place whole
    (a leftover temporary directory is not it, and one left over an hour ago is swept); a second session opens the file without rebuilding it and
    answers the same logits; another RoPE config of the same weights gets its own graph."""
    import copy
    import os
    import time

    from softknn.generate.runtime import graph_file

    tiny = _tiny("llama", smol.tokenizer)
    (tmp_path / ".stale.tmp").mkdir()  # a writer killed mid-way, a minute ago: maybe still writing
    (tmp_path / ".dead.0a1b2c3d.tmp").mkdir()  # one killed two hours ago: swept
    os.utime(tmp_path / ".dead.0a1b2c3d.tmp", (time.time() - 7200, time.time() - 7200))
    path = graph_file(tiny.model, "fp32", [1, 2], tmp_path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["done", "model.onnx", "weights.bin"]
    assert (path.parent / "weights.bin").stat().st_size > 64 * 128 * 4  # the initializers live outside model.onnx
    mtime = os.stat(path).st_mtime_ns
    assert graph_file(tiny.model, "fp32", [1, 2], tmp_path) == path and os.stat(path).st_mtime_ns == mtime
    assert graph_file(tiny.model, "fp32", [2], tmp_path) != path
    scaled = copy.deepcopy(tiny.model)
    scaled.config.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    assert graph_file(scaled, "fp32", [1, 2], tmp_path).parent != path.parent
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [".stale.tmp"]

    prompt = tiny.layout(prompt=PROMPTS[0])[1]
    logits = []
    for _ in range(2):  # the second opens the file the first wrote
        loop = DecodeLoop(DecoderSession(tiny.model, "fp32", [1, 2], cache_dir=tmp_path), tiny.eos_ids,
                          tiny.tokenizer)
        try:
            logits.append(_gen(loop.submit(job_for(prompt, None, Sampling(max_tokens=3), keep_logits=True))).logits)
        finally:
            loop.close()
    assert len(logits[0]) == 3 and all(torch.equal(a, b) for a, b in zip(*logits, strict=True))
