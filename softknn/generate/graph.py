"""The generator's decode graph for ONNX Runtime, written op by op from a Llama-family model's weights.

One graph serves prefill (T tokens of one sequence, a whole prompt or a chunk of it) and batched
decoding (one token of each of B sequences). The KV cache lives outside the graph, preallocated by
the caller (softknn.generate.batch): one buffer per layer for keys and one for values, (B, nkv, C, hs)
each for C cache columns, which hold the retrieved chunks' stored keys/values first and then the
sequence's own tokens. ONNX Runtime's GroupQueryAttention reads and writes them in place (past and
present bound to the same buffer): row b holds seqlens_k[b] + 1 columns after the step, the T new
ones last.

Per layer ℓ, with q, k, v the new tokens' (RoPE on q and k at `position_ids`, d = head dim), for
row b over its own columns j ≤ seqlens_k[b] (causal among the new ones):

    s    = q·K[b, :, j]ᵀ / √d + bias[b, 0, t, j]
    out  = softmax_j(s) · V[b, :, j]

`bias` (B, 1, T, S), S = total_sequence_length (the longest row), is additive: 0 where a query row
may attend, −inf where it may not (a prefix row facing the memory), and log π_c (the k-NN prior) on chunk
c's columns — so the joint softmax over [R's tokens ; own context] with the k-NN prior of
softknn.generate.attention is the model's own attention over a cache with a float mask. Layers that
hold no memory read `bias_plain` (the memory columns −inf). The graph returns the last position's
logits (B, V), and `attn` (B, S): the last row's attention probabilities, averaged over the heads and
memory layers — the evidence trace.

Weights: `fp32` (MatMul, the model's numbers), `q4` (MatMulNBits 4-bit blocks, softknn.generate.quant:
lossless for a GGUF Q4_1/Q8_0 model, activations in float32), `q4a8` (the same blocks, activations
quantised to int8 per block inside the kernel, as llama.cpp's dot products do), `w8a8` (each weight's
output channel rounded to int8 with its own scale (softknn.generate.quant.pack_w8), each token's
activations to 8 bits with its own scale, multiplied in integers by MatMulInteger — ONNX Runtime's
int8 GEMM (VNNI / AMX), whose cost hardly grows with the rows of a batched step, where MatMulNBits'
grows with each row: the 4-bit layers take 62 ms at 16 rows against 11.5 at one, the int8 ones 11.3
against 9.8; the integer products are exact, so a row's result does not depend on the rows beside it.
The inputs' outlier channels are first moved into the weights (SmoothQuant, measured on the
calibration text: input_maxima), which brings w8a8's logits as close to float32's as q4a8's).

KV cache: `fp32`, or `int8` (ONNX Runtime's quantised cache for GroupQueryAttention): each key and value
is stored as round(x / s) clipped to ±127 with a fixed scale s per layer and channel (`kv_scales`:
the largest magnitude the model's keys and values reach on a calibration text, over each RoPE pair of
channels), and read back as that integer times s. A decode step at k = 8 reads each row's cache once
per layer; int8 reads a quarter of float32's bytes. The graph with an int8 cache computes what the
float32 graph computes on the dequantised cache (tests/core/test_decode_graph.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from softknn.common.errors import UnsupportedModel
from softknn.generate.families import max_positions
from softknn.generate.quant import is_lossless, pack_q4, pack_q8_as_two_q4, pack_w8, smoothing

WEIGHTS = ("fp32", "q4", "q4a8", "w8a8")
KV_FORMATS = ("fp32", "int8")
KV_DEFAULT = "int8"  # settings.generator.kv_cache's default too (softknn/params.py)
OPSET = 21  # QuantizeLinear's blocks (w8a8's activations: one scale a row)
ROUNDING = ("blocks", "ops")  # w8a8's activation rounding: one QuantizeLinear (served), or its reference ops
_ACCURACY = {"q4": 0, "q4a8": 4}  # MatMulNBits accuracy_level: 0 float activations, 4 int8


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int  # the positions a request may reach (softknn.generate.families.max_positions)
    eps: float

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


def decoder_shape(config) -> DecoderShape:
    """The decode graph's dimensions; its positions capped at a sliding window (below it, full attention
    is the model's attention: softknn.generate.families)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return DecoderShape(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                        config.num_key_value_heads, head_dim, config.intermediate_size, config.vocab_size,
                        max_positions(config), float(config.rms_norm_eps))


def check_supported(model) -> None:
    """The decode graph covers Llama / Qwen2 / Mistral: SiLU, RMSNorm, RoPE of fixed frequencies on the
    whole head (softknn.generate.families.ROPE_TYPES, YaRN's attention factor in the cos/sin tables), q/k/v
    biases or none, any grouping of query heads, heads × head dim other than the hidden size, tied or separate output embeddings, sliding windows (decoder_shape caps the
    positions). Anything else: UnsupportedModel naming what."""
    from softknn.generate.families import check_rope

    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"decode graph: activation {cfg.hidden_act!r}, not silu")
    check_rope(cfg, "decode graph")
    sh = decoder_shape(cfg)
    rotary = model.model.rotary_emb
    if 2 * int(rotary.inv_freq.shape[0]) != sh.head_dim:
        raise UnsupportedModel(f"decode graph: RoPE on {2 * int(rotary.inv_freq.shape[0])} of the head's "
                               f"{sh.head_dim} dimensions")
    if getattr(cfg, "mlp_bias", False):
        raise UnsupportedModel("decode graph: MLP biases")
    attn = model.model.layers[0].self_attn
    if attn.o_proj.bias is not None:
        raise UnsupportedModel("decode graph: an output-projection bias (attention_bias)")
    if len({attn.q_proj.bias is None, attn.k_proj.bias is None, attn.v_proj.bias is None}) > 1:
        raise UnsupportedModel("decode graph: biases on some of q, k and v only")


@dataclass
class _Builder:
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    n: int = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def ops(self, op_type: str, inputs: list[str], hint: str, outputs: int, domain: str = "", **attrs) -> list[str]:
        """A node of `outputs` outputs; their names."""
        from onnx import helper

        outs = [self.name(hint) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(f"{hint}.{op_type}"), domain=domain, **attrs))
        return outs

    def op(self, op_type: str, inputs: list[str], hint: str, domain: str = "", **attrs) -> str:
        """A node of one output; its name."""
        return self.ops(op_type, inputs, hint, 1, domain, **attrs)[0]

    def const(self, value: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.require(value, requirements='C'), name))  # keeps 0-d scalars 0-d
        return name

    def ints(self, values: list[int], hint: str = "shape") -> str:
        return self.const(np.array(values, dtype=np.int64), hint)


class _Linear:
    """x (…, K) @ Wᵀ (+ b) in the chosen weight format."""

    def __init__(self, b: _Builder, weights: str, rounding: str = "blocks"):
        if rounding not in ROUNDING:
            raise ValueError(f"w8a8 activation rounding must be one of {ROUNDING}, not {rounding!r}")
        self.b, self.weights, self.rounding = b, weights, rounding
        self._blocksum_shape = {3: b.ints([0, 0, -1, 32], "blocks"), 2: b.ints([0, -1, 32], "blocks")}
        self._axis = b.ints([-1], "axis")
        if weights == "w8a8":
            self._inv127 = b.const(np.array(1 / 127, dtype=np.float32), "inv127")
            self._tiny = b.const(np.array(1e-30, dtype=np.float32), "tiny")
            self._u8_zero = b.const(np.array(128, dtype=np.uint8), "u8zero")
            self._u8_zero_f = b.const(np.array(128, dtype=np.float32), "u8zero_f")
            self._u8_zero_block = {r: b.const(np.full((1,) * r, 128, dtype=np.uint8), "u8zero") for r in (2, 3)}
        self._zero_points: dict[int, str] = {}  # rank -> the (…, 1) zero points of the rows, made once a segment

    def segment(self) -> None:
        """A new segment begins (split_segments cuts here): its zero points are made in it again."""
        self._zero_points = {}

    def __call__(self, x: str, w: np.ndarray, hint: str, bias: np.ndarray | None = None, q8: bool = False,
                 rank: int = 3) -> str:
        b = self.b
        if self.weights == "w8a8":
            y = self._w8a8(x, w, hint, rank)
        elif self.weights == "fp32":
            y = b.op("MatMul", [x, b.const(np.ascontiguousarray(w.T, dtype=np.float32), hint + "_wT")], hint)
        else:
            parts = list(pack_q8_as_two_q4(w)) if q8 else [pack_q4(w)]
            terms = []
            for j, p in enumerate(parts):
                n, k = p.shape
                zp = b.const(np.zeros((n, (k // 32 + 1) // 2), dtype=np.uint8), hint + "_zp")
                terms.append(b.op("MatMulNBits", [x, b.const(p.codes, f"{hint}_q{j}"), b.const(p.scales, f"{hint}_d{j}"),
                                                  zp], hint, domain="com.microsoft", K=k, N=n, bits=4, block_size=32,
                                  accuracy_level=_ACCURACY[self.weights]))
            mins = np.sum([p.mins for p in parts], axis=0)  # (N, K/32)
            if np.any(mins != 0):  # Σ_b m[n, b]·blocksum_b(x): the blocks' float minimum (softknn.generate.quant)
                xs = b.op("ReduceSum", [b.op("Reshape", [x, self._blocksum_shape[rank]], hint), self._axis], hint,
                          keepdims=0)  # (…, K/32)
                terms.append(b.op("MatMul", [xs, b.const(np.ascontiguousarray(mins.T, dtype=np.float32), hint + "_mT")],
                                  hint))
            y = terms[0]
            for t in terms[1:]:
                y = b.op("Add", [y, t], hint)
        if bias is not None:
            y = b.op("Add", [y, b.const(bias.astype(np.float32), hint + "_b")], hint)
        return y

    def _w8a8(self, x: str, w: np.ndarray, hint: str, rank: int) -> str:
        """x @ Wᵀ as (sx · xq) @ (Wq · sw)ᵀ = sx · sw · (xq @ Wqᵀ): Wq = round(W / sw) per output channel
        (softknn.generate.quant.pack_w8), xq = round(x / sx) + 128 as uint8 with sx = max|x| / 127 over
        each row's K (zero point 128: u8 × s8 is the integer kernels' native form). xq in one
        QuantizeLinear whose block is the row (x / sx rounded half to even, plus the zero point); the
        `ops` rounding, the reference kept beside it, in Div, Round, Add and Cast, four passes over the
        rows: the same codes (tests/core/test_decode_graph.py; bench/step_split.py times both)."""
        xq, sx = self._activations(x, int(w.shape[1]), hint, rank)
        return self._w8_product(xq, sx, w, hint)

    def _activations(self, x: str, k: int, hint: str, rank: int) -> tuple[str, str]:
        """(xq, sx) of x's rows (_w8a8): the codes as uint8 and the scales (…, 1)."""
        b = self.b
        amax = b.op("ReduceMax", [b.op("Abs", [x], hint), self._axis], hint, keepdims=1)  # (…, 1)
        sx = b.op("Max", [b.op("Mul", [amax, self._inv127], hint), self._tiny], hint)  # an all-zero row: any scale
        if self.rounding == "ops":
            xq = b.op("Cast", [b.op("Add", [b.op("Round", [b.op("Div", [x, sx], hint)], hint), self._u8_zero_f], hint)],
                      hint, to=2)  # uint8
        else:
            xq = self._quantize_rows(x, sx, hint, rank, k)
        return xq, sx

    def _w8_product(self, xq: str, sx: str, w: np.ndarray, hint: str) -> str:
        b = self.b
        wq, sw = pack_w8(w)
        yi = b.op("MatMulInteger", [xq, b.const(np.ascontiguousarray(wq.T), hint + "_w8T"), self._u8_zero], hint)
        scale = b.op("Mul", [sx, b.const(sw, hint + "_sw")], hint)  # (…, N)
        return b.op("Mul", [b.op("Cast", [yi], hint, to=1), scale], hint)

    def many(self, x: str, ws: list[np.ndarray], hint: str, biases: list[np.ndarray] | None = None,
             rank: int = 3) -> list[str]:
        """x @ Wᵀ (+ bias) for each W of ws, each output its own tensor: w8a8 rounds x's rows once for all
        of them (a product per W, no Split of one wide product afterwards; each output channel is its
        own weight row and scale, so the numbers are those of one product over the stacked weights)."""
        bs: list[np.ndarray | None] = list(biases) if biases else [None] * len(ws)
        if self.weights != "w8a8":
            return [self(x, w, f"{hint}_{i}", bias, rank=rank) for i, (w, bias) in enumerate(zip(ws, bs, strict=True))]
        xq, sx = self._activations(x, int(ws[0].shape[1]), hint, rank)
        out = []
        for i, (w, bias) in enumerate(zip(ws, bs, strict=True)):
            y = self._w8_product(xq, sx, w, f"{hint}_{i}")
            out.append(y if bias is None else self.b.op("Add", [y, self.b.const(bias.astype(np.float32), f"{hint}_{i}_b")], hint))
        return out

    def _quantize_rows(self, x: str, sx: str, hint: str, rank: int, k: int) -> str:
        """round(x / sx) + 128 as uint8 in one QuantizeLinear, a block being a row of K."""
        b = self.b
        if rank not in self._zero_points:  # the rows' zero points, shaped as their scales (QuantizeLinear's blocks)
            self._zero_points[rank] = b.op("Expand", [self._u8_zero_block[rank], b.op("Shape", [sx], hint)], hint)
        return b.op("QuantizeLinear", [x, sx, self._zero_points[rank]], hint, axis=-1, block_size=k)


def rope_tables(inv_freq: torch.Tensor, max_positions: int, attention_scaling: float = 1.0
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (max_positions, hs/2) of p·θ_i times the rotary embedding's attention_scaling (YaRN's
    factor, 1 for the other types), computed as transformers' rotary embedding computes them. RoPE is
    linear, so the scaled tables give s·rot(x), and q·k carries s² as in the model."""
    freqs = torch.arange(max_positions)[:, None].float() * inv_freq.float()[None]  # (P, hs/2)
    return (freqs.cos() * attention_scaling).numpy(), (freqs.sin() * attention_scaling).numpy()


def rope_for(model) -> tuple[np.ndarray, np.ndarray]:
    """The decode graph's RoPE tables of `model` (rope_tables at its rotary embedding, up to its positions)."""
    rotary = model.model.rotary_emb
    return rope_tables(rotary.inv_freq, decoder_shape(model.config).max_positions,
                       float(getattr(rotary, "attention_scaling", 1.0)))


# the int8 cache's calibration: prose of the kinds a KB holds (rules, FAQ answers, figures, names), read
# as the chat template's user turn so the template's own tokens (the attention sink among them) are in it
CALIBRATION_TEXT = (
    "Article 12. Reporting obligations. (1) An authorised firm must submit its annual audited financial "
    "statements to the Regulator within four months of the end of its financial year, together with the "
    "auditor's report and any management letter. (2) Where the firm fails to do so, the Regulator may impose "
    "a fine of up to USD 25,000 or suspend the licence. Q: Can I bring my dog on the ferry? A: Dogs on a "
    "lead are welcome on the open deck from September to February; assistance dogs travel all year. "
    "Tickets cost 4.50 EUR for adults, 2.25 EUR for children under 12, and departures leave every 40 "
    "minutes between 06:15 and 22:45. The committee met on 3 March 2021 in Abu Dhabi; Dr. Amira Haddad "
    "chaired it, and 17 of its 19 members voted for the amendment to Rule 7.3.2(b). def mean(xs): return "
    "sum(xs) / len(xs)  # 3.14159, 2.71828, 1e-6, 0x1F, https://example.org/kb?id=42.")


def kv_scales(model, ids: list[int]) -> np.ndarray:
    """The int8 cache's scales (L, 2, nkv, hs) float32, keys then values: per layer and channel the
    largest |x| the model's keys (after RoPE) and values reach on `ids` (one forward at positions 0..),
    over each RoPE pair of key channels (i, i + hs/2), whose magnitudes rotate into each other at
    other positions; divided by 127. A value beyond it is clipped to ±127·s."""
    from transformers import DynamicCache

    sh = decoder_shape(model.config)
    cache = DynamicCache(config=model.config)
    kw = "cache" if "cache" in inspect.signature(type(model.model).forward).parameters else "past_key_values"
    with torch.inference_mode():
        model.model(input_ids=torch.tensor([ids]), use_cache=True, **{kw: cache})
    out = np.zeros((sh.layers, 2, sh.kv_heads, sh.head_dim), dtype=np.float32)
    half = sh.head_dim // 2
    for li in range(sh.layers):
        # a DynamicCache of full-attention layers: transformers types its layers as the union of every kind
        k = cache.layers[li].keys[0].float().abs().amax(1).numpy()  # type: ignore[union-attr, index]  # (nkv, hs)
        v = cache.layers[li].values[0].float().abs().amax(1).numpy()  # type: ignore[union-attr, index]
        pair = np.maximum(k[:, :half], k[:, half:])
        out[li, 0] = np.concatenate([pair, pair], axis=1)
        out[li, 1] = v
    return np.maximum(out, 1e-6) / 127.0


def input_maxima(model, ids: list[int]) -> dict[str, np.ndarray]:
    """Per layer and input channel, the largest |x| the inputs of the attention's q/k/v projections
    (`qkv`, (L, H)), the MLP's gate/up (`gu`, (L, H)) and its down projection (`down`, (L, I)) reach when
    the model reads `ids` (one forward): what w8a8's smoothing (softknn.generate.quant.smoothing) is
    measured on."""
    sh = decoder_shape(model.config)
    out = {"qkv": np.zeros((sh.layers, sh.hidden), np.float32), "gu": np.zeros((sh.layers, sh.hidden), np.float32),
           "down": np.zeros((sh.layers, sh.intermediate), np.float32)}
    hooks = []

    def keep(kind: str, li: int):
        def hook(_module, inputs):
            out[kind][li] = inputs[0].detach().float().abs().reshape(-1, inputs[0].shape[-1]).amax(0).numpy()
        return hook

    for li, layer in enumerate(model.model.layers):
        hooks += [layer.self_attn.q_proj.register_forward_pre_hook(keep("qkv", li)),
                  layer.mlp.gate_proj.register_forward_pre_hook(keep("gu", li)),
                  layer.mlp.down_proj.register_forward_pre_hook(keep("down", li))]
    try:
        with torch.inference_mode():
            model.model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return out


def build_decoder(model, weights: str, memory_layers: list[int], kv: str = "fp32", scales: np.ndarray | None = None,
                  maxima: dict[str, np.ndarray] | None = None, split: bool = False, rounding: str = "blocks"):
    """The onnx.ModelProto of `model`'s decode step (module doc) with memory at `memory_layers`, its KV
    cache in `kv` format (`int8`: `scales` from kv_scales). `w8a8` with `maxima` (input_maxima): each
    linear's input channels smoothed (softknn.generate.quant.smoothing), the factors folded into the
    RMSNorm weights before q/k/v and gate/up and into up's rows before down, and into the weights'
    columns: the same function, with the activations' outlier channels moved into the weights.

    `split`: the same graph without its attention, cut at each layer's attention into L + 1 segments (a
    list of ModelProtos; split_segments), for the C kernel (softknn.generate.kernel) to run attention
    between them: segment ℓ outputs `xres_ℓ` (the residual stream before layer ℓ's attention) and `q_ℓ`,
    `k_ℓ`, `v_ℓ` (after RoPE); segment ℓ + 1 reads `xres_ℓ` and the attention's output `o_ℓ` (B, T, nh·hs);
    the last outputs `logits` of each row's token `last_index` (B, 1) (rows of T tokens and fewer, padded). The RoPE tables are the inputs `rope_cos`, `rope_sin` (rope_tables), one
    array the caller binds to every segment rather than a copy in each."""
    from onnx import TensorProto, helper

    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, not {weights!r}")
    if kv not in KV_FORMATS:
        raise ValueError(f"kv cache must be one of {KV_FORMATS}, not {kv!r}")
    if kv == "int8" and scales is None:
        raise ValueError("an int8 kv cache needs its scales (kv_scales)")
    check_supported(model)
    sh = decoder_shape(model.config)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    b = _Builder()
    lin = _Linear(b, weights, rounding)
    nh, nkv, hs = sh.heads, sh.kv_heads, sh.head_dim
    mem = set(memory_layers)
    plain_needed = len(mem) < sh.layers
    cache_type = TensorProto.INT8 if kv == "int8" else TensorProto.FLOAT

    cos, sin = rope_for(model)
    if split:
        cos_c, sin_c = "rope_cos", "rope_sin"
    else:
        cos_c, sin_c = b.const(cos, "cos"), b.const(sin, "sin")
    cuts: list[int] = []
    last = b.const(np.array(-1, dtype=np.int64), "last")
    axis_heads = b.ints([1], "axes")

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "T"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["B", 1, "T", "S"])]
    if plain_needed:
        inputs.append(helper.make_tensor_value_info("bias_plain", TensorProto.FLOAT, ["B", 1, "T", "S"]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", sh.vocab])]
    emb = sd["model.embed_tokens.weight"]
    x = b.op("Gather", [b.const(emb, "embed"), "input_ids"], "x", axis=0)  # (B, T, H)
    attn_sum = None
    for li in range(sh.layers):
        p = f"model.layers.{li}."
        # the attention's 1/√d folded into W_q (RoPE is linear: rot(s·q) = s·rot(q)); exact for d = 64
        scaling = np.float32(hs**-0.5)
        wqkv = np.concatenate([sd[p + "self_attn.q_proj.weight"] * scaling, sd[p + "self_attn.k_proj.weight"],
                               sd[p + "self_attn.v_proj.weight"]])
        ln1, ln2 = sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"]
        wgu = np.concatenate([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        wdown = sd[p + "mlp.down_proj.weight"]
        if weights == "w8a8" and maxima is not None:  # x/s into the op before, s into the weight's columns
            s1, s2, s3 = (smoothing(maxima["qkv"][li], wqkv), smoothing(maxima["gu"][li], wgu),
                          smoothing(maxima["down"][li], wdown))
            ln1, wqkv, ln2, wgu = ln1 / s1, wqkv * s1, ln2 / s2, wgu * s2
            wgu = np.concatenate([wgu[: sh.intermediate], wgu[sh.intermediate :] / s3[:, None]])  # up's rows
            wdown = wdown * s3
        h = b.op("SimplifiedLayerNormalization", [x, b.const(ln1.astype(np.float32), "ln1")], "h",
                 axis=-1, epsilon=sh.eps, stash_type=1)
        bqkv = None
        if p + "self_attn.q_proj.bias" in sd:
            bqkv = np.concatenate([sd[p + "self_attn.q_proj.bias"] * scaling, sd[p + "self_attn.k_proj.bias"],
                                   sd[p + "self_attn.v_proj.bias"]])
        qkv = lin(h, wqkv, f"qkv{li}", bqkv)  # (B, T, (nh + 2·nkv)·hs)
        q, k, v = b.ops("Split", [qkv, b.ints([nh * hs, nkv * hs, nkv * hs], "split")], "qkv", 3, axis=-1)
        q = b.op("RotaryEmbedding", [q, "position_ids", cos_c, sin_c], "q", domain="com.microsoft",
                 num_heads=nh, interleaved=0)  # (B, T, nh·hs), scaled
        k = b.op("RotaryEmbedding", [k, "position_ids", cos_c, sin_c], "k", domain="com.microsoft",
                 num_heads=nkv, interleaved=0)  # (B, T, nkv·hs)
        if split:  # the segment ends here: the kernel attends, the next segment reads o_ℓ
            for role, val in (("xres", x), ("q", q), ("k", k), ("v", v)):
                b.nodes.append(helper.make_node("Identity", [val], [f"{role}_{li}"], name=f"{role}_{li}_out"))
            cuts.append(len(b.nodes))
            lin.segment()
            x, o = f"xres_{li}", f"o_{li}"
        else:
            # the cache is one buffer per layer, past and present bound to it (B, nkv, C, hs): the kernel
            # appends the T new keys/values at columns seqlens_k + 1 − T … seqlens_k of each row and reads
            # only that row's columns 0 … seqlens_k (causal among the new ones); `bias` adds the prior and
            # hides what a row may not see
            outs = [b.name("o"), f"present_key_{li}", f"present_value_{li}"] + ([b.name("qk")] if li in mem else [])
            gqa_in = [q, k, v, f"past_key_{li}", f"past_value_{li}", "seqlens_k", "total_sequence_length",
                      "", "", "", "bias" if li in mem else "bias_plain"]
            quant: dict[str, Any] = {}
            if scales is not None:  # int8: inputs 12, 13 are the layer's key and value scales, one per channel (nkv·hs)
                gqa_in += ["", b.const(scales[li, 0].reshape(-1), "k_scale"), b.const(scales[li, 1].reshape(-1), "v_scale")]
                quant = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}
            b.nodes.append(helper.make_node(
                "GroupQueryAttention", gqa_in, outs, name=b.name("gqa"), domain="com.microsoft", num_heads=nh,
                kv_num_heads=nkv, scale=1.0, qk_output=2 if li in mem else 0, **quant))
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_{kind}_{li}", cache_type, ["B", nkv, "C", hs]))
                outputs.append(helper.make_tensor_value_info(f"present_{kind}_{li}", cache_type, ["B", nkv, "C", hs]))
            o = outs[0]
        x = b.op("Add", [x, lin(o, sd[p + "self_attn.o_proj.weight"], f"o{li}")], "x")  # (B, T, H)
        h = b.op("SimplifiedLayerNormalization", [x, b.const(ln2.astype(np.float32), "ln2")], "h",
                 axis=-1, epsilon=sh.eps, stash_type=1)
        x = _mlp(b, lin, x, h, wgu, wdown, sh, li)
        if li in mem and not split:  # the last row's probabilities, summed over memory layers: (B, nh, S)
            pl = b.op("Gather", [outs[3], last], "plast", axis=2)
            attn_sum = pl if attn_sum is None else b.op("Add", [attn_sum, pl], "attn")
    x = b.op("SimplifiedLayerNormalization", [x, b.const(sd["model.norm.weight"], "norm")], "h", axis=-1,
             epsilon=sh.eps, stash_type=1)
    if split:  # (B, H): each row's own last token (`last_index` (B, 1): rows of a batched prefill end apart)
        xl = b.op("GatherND", [x, "last_index"], "xlast", batch_dims=1)
    else:
        xl = b.op("Gather", [x, last], "xlast", axis=1)  # (B, H): the last position
    head_w = model.get_output_embeddings().weight.detach().float().numpy()  # the embedding itself when tied
    q8 = weights != "fp32" and is_lossless(head_w, list(pack_q8_as_two_q4(head_w)))
    logits = lin(xl, head_w, "head", q8=q8, rank=2)
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))
    if attn_sum is not None:  # the mean over heads and memory layers: (B, S)
        pm = b.op("ReduceMean", [attn_sum, axis_heads], "pmean", keepdims=0)
        b.nodes.append(helper.make_node("Mul", [pm, b.const(np.array(1.0 / len(mem), dtype=np.float32), "inv")],
                                        ["attn"], name="attn_out"))
        outputs.append(helper.make_tensor_value_info("attn", TensorProto.FLOAT, ["B", "S"]))
    if split:
        return split_segments(b, cuts, {f"{r}_{li}" for li in range(sh.layers) for r in "qkv"} | {"logits"}, sh)
    graph = helper.make_graph(b.nodes, "softknn_decoder", inputs, outputs, b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
                             producer_name="softknn")


def _mlp(b: _Builder, lin: _Linear, x: str, h: str, wgu: np.ndarray, wdown: np.ndarray, sh: DecoderShape, li: int) -> str:
    """x + down(silu(gate(h)) · up(h)): the layer's MLP on its residual stream."""
    gate, up = lin.many(h, [wgu[: sh.intermediate], wgu[sh.intermediate :]], f"gu{li}")
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate], "sig")], "silu"), up], "act")
    return b.op("Add", [x, lin(act, wdown, f"down{li}")], "x")




def split_segments(b: _Builder, cuts: list[int], exports: set[str], sh: DecoderShape) -> list:
    """The builder's nodes cut before each index of `cuts` into graphs: each holds its nodes and the
    initializers they read; a value one segment makes and a later one reads is the first's output and the
    second's input (by name), as are the graph's own inputs a segment reads; `exports`: the values read
    outside the graphs, outputs of the segment that makes them."""
    from onnx import TensorProto, helper

    def info(n: str):  # the boundary values' types and shapes (ONNX Runtime's fusions look at them)
        role = n.rpartition("_")[0]
        shape: dict[str, list[str | int]] = {"input_ids": ["B", "T"], "position_ids": ["B", "T"], "last_index": ["B", 1], "rope_cos": ["P", sh.head_dim // 2],
                 "rope_sin": ["P", sh.head_dim // 2], "logits": ["B", sh.vocab], "xres": ["B", "T", sh.hidden],
                 "q": ["B", "T", sh.heads * sh.head_dim], "o": ["B", "T", sh.heads * sh.head_dim],
                 "k": ["B", "T", sh.kv_heads * sh.head_dim], "v": ["B", "T", sh.kv_heads * sh.head_dim]}
        dims = shape.get(n, shape.get(role))
        kind = TensorProto.INT64 if n.endswith("_ids") or n == "last_index" else TensorProto.FLOAT
        return helper.make_tensor_value_info(n, kind, dims)

    bounds = [0, *cuts, len(b.nodes)]
    inits = {t.name: t for t in b.inits}
    segs = [b.nodes[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
    made = [{o for n in seg for o in n.output} for seg in segs]
    read = [{i for n in seg for i in n.input if i} for seg in segs]
    models = []
    for si, seg in enumerate(segs):
        ins = sorted(read[si] - made[si] - inits.keys())
        later = set().union(*read[si + 1 :]) if si + 1 < len(segs) else set()
        outs = sorted(made[si] & (later | exports))
        graph = helper.make_graph(
            seg, f"softknn_decoder_{si}",
            [info(n) for n in ins], [info(n) for n in outs],
            [inits[n] for n in sorted(read[si] & inits.keys())])
        models.append(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                              helper.make_opsetid("com.microsoft", 1)],
                                        producer_name="softknn"))
    return models


def lossless_q4(model) -> bool:
    """Whether every linear weight of the decoder layers is exactly 4-bit blocks (a GGUF Q4_1 model):
    then `q4` multiplies by the model's own numbers."""
    for name, w in model.state_dict().items():
        if ".layers." in name and name.endswith("proj.weight"):
            a = w.detach().float().numpy()
            if not is_lossless(a, [pack_q4(a)]):
                return False
    return True


def resolve_weights(model, weights: str) -> str:
    """`auto` → w8a8 where the weights are 4-bit blocks (lossless_q4: a GGUF Q4_1 model, already rounded,
    whose answers w8a8 keeps: bench/results/gen_quality_wformats.json), else fp32; any other value as
    given."""
    if weights == "auto":
        return "w8a8" if lossless_q4(model) else "fp32"
    if weights not in WEIGHTS:
        raise ValueError(f"generator weights must be auto or one of {WEIGHTS}, not {weights!r}")
    return weights
