"""The fused attention of the memory layer, its diagnostics, and a plain reference beside it.

Two soft k-NNs, one inside the other (seed 000 §4.3, DESIGN.md). Per head, for query position i:

    attn_intra(i) = softmax_j(q_i·k_j·scale) · V_in                      (the layer's own attention)
    attn_db(i)    = Σ_{c∈R} w_db(c) · softmax_{t∈c}(q_i·k_t·scale) · V_c
    fixed:  out_i = α·attn_intra(i) + (1−α)·attn_db(i)
    joint:  out_i = softmax over [input tokens ; all tokens of R](q_i·k·scale) · [V_in ; V_R]

Both are one form, out_i = g_in·attn_intra(i) + Σ_c g_c·attn_c(i), with the gates
fixed: g_in = α, g_c = (1−α)·w_db(c);  joint: g_in = Z_in/Z, g_c = Z_c/Z (each part's share of
the joint partition function). The fast path computes that form batched; the reference loops.
An input whose R is empty (a compact kernel with no chunk in its window) keeps the plain layer.

Naming: `x` is the path the engine runs and `x_reference` the plain version beside it that a test
compares it with (`fused_attention` / `fused_attention_reference`); `x_row` is the numpy form of
the batched torch `x` for one input's scores, the per-request path (`knn_weights_row`,
`truncation_bound_row`; tests/core/test_fast_paths.py compares the two). The kernel K is written
once per backend (`_kernel`, `_kernel_row`).

The hook at the end is how a model reaches that computation: softknn registers one attention
implementation with transformers' `AttentionInterface`, "softknn": plain SDPA everywhere, except at
the one attention module a hook is bound to (`bind_hook`: a context variable, so concurrent threads
never see each other's hook), which captures that layer's q/k/v (`CaptureKV`: the builder, the plain
pass, the ONNX export) or replaces its attention (the encoder's fused pass, softknn.model.encoder).
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from softknn.common.table import KERNELS  # noqa: F401 (re-exported)


@dataclass
class MemoryBatch:
    """The retrieved chunks of a batch, padded to S slots of Lm tokens each."""

    key: torch.Tensor  # (B, nh, S, Lm, hs) layer-L keys of the chunks' non-special tokens
    value: torch.Tensor  # (B, nh, S, Lm, hs)
    token_mask: torch.Tensor  # (B, S, Lm) bool, True on real memory tokens
    weight: torch.Tensor  # (B, S) w_db; 0 on empty slots; rows sum to 1 where R is non-empty

    @property
    def slot_mask(self) -> torch.Tensor:
        return self.token_mask.any(-1)  # (B, S)


@dataclass
class FusedResult:
    out: torch.Tensor  # (B, nh, T, hs) the layer's attention output
    attn_in: torch.Tensor  # (B, nh, T, hs) attn_intra
    p_mem: torch.Tensor  # (B, nh, T, S, Lm) softmax within each chunk (0 on pad tokens and empty slots)
    gate_in: torch.Tensor  # (B, nh, T) g_in
    gate_mem: torch.Tensor  # (B, nh, T, S) g_c
    entropy: torch.Tensor  # (B, nh, T) entropy of the whole fused distribution (nats)
    entropy_in: torch.Tensor  # (B, nh, T) entropy of the intra softmax alone
    lse_mem: torch.Tensor  # (B, nh, T, S) log Σ_{t∈c} exp(q_i·k_t·scale): how strongly i matches c
    mem_value: torch.Tensor  # (B, nh, S, Lm, hs) the memory values, for slot_attention
    mem_out: torch.Tensor  # (B, nh, T, hs) Σ_c g_c·attn_c, the memory's part of out (fixed: (1−α)·attn_db)

    def slot_attention(self, b: int) -> torch.Tensor:
        """attn_c = softmax_{t∈c}(q·k_t·scale)·V_c for every slot of input b, (nh, T, S, hs).

        Computed on demand (evidence's influence needs it; the forward needs only Σ_c g_c·attn_c).
        """
        return torch.einsum("htsl,hsld->htsd", self.p_mem[b], self.mem_value[b])


def _kernel(scores: torch.Tensor, temperature: float, kernel: str) -> torch.Tensor:
    """K(u) of a compact kernel on float64 scores: epanechnikov max(0, 1 − d²/τ), uniform 1[d² ≤ τ],
    with d² = 2 − 2s (see knn_weights)."""
    u2 = (2.0 - 2.0 * scores) / temperature
    return (1.0 - u2).clamp(min=0.0) if kernel == "epanechnikov" else (u2 <= 1.0).double()


def _kernel_row(scores: np.ndarray | float, temperature: float, kernel: str) -> np.ndarray:
    """`_kernel` in numpy (float64), for the one-row path."""
    u2 = (2.0 - 2.0 * scores) / temperature
    return np.clip(1.0 - u2, 0.0, None) if kernel == "epanechnikov" else np.asarray(u2 <= 1.0).astype(np.float64)


def knn_weights(scores: torch.Tensor, valid: torch.Tensor, temperature: float, kernel: str = "softmax") -> torch.Tensor:
    """Nadaraya–Watson weights of retrieved chunks: w[b, c] = K(u_bc) / Σ_c' K(u_bc').

    scores (B, S) are inner products of unit vectors, so the squared distance is d² = 2 − 2s.
    softmax: K = exp(s/τ) — the Gaussian kernel exp(−d²/2h²) with h² = τ (seed 001: bandwidth ≈
    temperature). epanechnikov: K = max(0, 1 − d²/τ); uniform: K = 1[d² ≤ τ] — the same bandwidth.
    Rows with no chunk inside a compact kernel's window come back all zero (R is empty).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    scores = scores.double()
    if kernel == "softmax":
        logits = (scores / temperature).masked_fill(~valid, -math.inf)
        w = torch.softmax(logits, dim=-1)
        return torch.nan_to_num(w, nan=0.0).float()  # a row with no valid slot is all zero
    k = _kernel(scores, temperature, kernel) * valid
    total = k.sum(-1, keepdim=True)
    return torch.where(total > 0, k / total.clamp(min=1e-300), torch.zeros_like(k)).float()


def truncation_bound(scores: torch.Tensor, valid: torch.Tensor, n_total: int, temperature: float, kernel: str) -> torch.Tensor:
    """Upper bound on the kernel mass top-k truncation dropped, per row (B,).

    Every chunk outside R scores at most min_R s, so its kernel value is at most K(min_R s), and
    dropped ≤ (N−|R|)·K(s_min) / (Σ_R K(s) + (N−|R|)·K(s_min)). Zero when R covers the KB.
    """
    scores = scores.double()
    r = valid.sum(-1).double()
    rest = (n_total - r).clamp(min=0)
    s_min = scores.masked_fill(~valid, math.inf).min(-1).values
    if kernel == "softmax":
        kept = torch.logsumexp((scores / temperature).masked_fill(~valid, -math.inf), -1)
        dropped = torch.log(rest) + s_min / temperature
        bound = torch.exp(dropped - torch.logaddexp(kept, dropped))
    else:
        kept = (_kernel(scores, temperature, kernel) * valid).sum(-1)
        kmin = _kernel(s_min, temperature, kernel)
        denom = kept + rest * kmin
        bound = torch.where(denom > 0, rest * kmin / denom.clamp(min=1e-300), torch.zeros_like(denom))
    bound = torch.where((rest > 0) & (r > 0), bound, torch.zeros_like(bound))
    return torch.nan_to_num(bound, nan=0.0).float()


def knn_weights_row(scores: np.ndarray, temperature: float, kernel: str = "softmax") -> np.ndarray:
    """`knn_weights` for one input's scores (r,) in numpy: the per-request path.

    The same float64 formulas, rounded to float32 like `knn_weights`, without a dozen torch op
    dispatches on 8 numbers (the torch truncation bound alone took ≈ 0.43 ms per input in a
    pyinstrument profile of Engine.infer; tests/core/test_fast_paths.py compares the two on every kernel).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s.astype(np.float32)
    if kernel == "softmax":
        e = np.exp(s / temperature - (s / temperature).max())
        return (e / e.sum()).astype(np.float32)
    k = _kernel_row(s, temperature, kernel)
    total = k.sum()
    return (k / total if total > 0 else np.zeros_like(k)).astype(np.float32)


def truncation_bound_row(scores: np.ndarray, n_total: int, temperature: float, kernel: str) -> float:
    """`truncation_bound` for one input whose every score is valid, in numpy (see knn_weights_row)."""
    s = np.asarray(scores, dtype=np.float64)
    r = s.size
    rest = max(n_total - r, 0)
    if rest == 0 or r == 0:
        return 0.0
    s_min = s.min()
    if kernel == "softmax":
        z = s / temperature
        kept = z.max() + math.log(np.exp(z - z.max()).sum())
        dropped = math.log(rest) + s_min / temperature
        bound = math.exp(dropped - np.logaddexp(kept, dropped))
    else:
        kept, kmin = _kernel_row(s, temperature, kernel).sum(), float(_kernel_row(s_min, temperature, kernel))
        denom = kept + rest * kmin
        bound = rest * kmin / denom if denom > 0 else 0.0
    return 0.0 if math.isnan(bound) else float(np.float32(bound))


def entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy in nats, H = −Σ p log p (0·log 0 = 0)."""
    return torch.special.entr(p).sum(dim)


class MemorySoftmax(NamedTuple):
    """Each retrieved chunk's own softmax for every query position (`memory_softmax`)."""

    p: torch.Tensor  # (B, nh, T, S, Lm) softmax_{t∈c}(q_i·k_t·scale); 0 on pad tokens and empty slots
    lse: torch.Tensor  # (B, nh, T, S) log Z_c = log Σ_{t∈c} exp(q_i·k_t·scale); −inf on empty slots
    entropy: torch.Tensor  # (B, nh, T, S) H(p_c); 0 on empty slots
    scratch: torch.Tensor  # (B, nh, T, S, Lm) a spent buffer of p's shape, free for the caller to reuse


def memory_softmax(qs: torch.Tensor, memory: MemoryBatch) -> MemorySoftmax:
    """The per-chunk softmax of the scaled queries qs (B, nh, T, hs) over each slot's memory tokens.

    The scores of all S·Lm memory tokens are one matmul per (input, head); the softmax is one max,
    one exp and one sum over a view (B, nh, T, S, Lm) of them, and the chunk entropies come from
    the same pass, H(p_c) = log Z_c − Σ_t p_t (s_t − m_c).
    """
    B, nh, T, hs = qs.shape
    S, Lm = memory.token_mask.shape[1:]
    # (B, nh, T, hs) @ (B, nh, hs, S·Lm). Pad memory tokens get a finite floor (not −inf) so that
    # no pass below meets inf − inf. s − m_c is clamped at −80 before exp: torch's vectorised exp
    # leaves its fast path below ≈ −87.3 (measured 5–25× slower per element, −inf included), and
    # a token e^80 ≈ 10^35 times below its chunk's best carries no weight at float32 precision.
    # Pad tokens are then set to exactly 0; empty slots are zeroed at the end.
    x = (qs @ memory.key.reshape(B, nh, S * Lm, hs).transpose(-1, -2)).view(B, nh, T, S, Lm)
    pad = ~memory.token_mask[:, None, None]  # (B, 1, 1, S, Lm)
    x.masked_fill_(pad, torch.finfo(x.dtype).min / 2)
    m = x.amax(-1, keepdim=True)  # (B, nh, T, S, 1)
    x.sub_(m).clamp_(min=-80.0)  # s − m_c ∈ [−80, 0]
    p = torch.exp(x).masked_fill_(pad, 0.0)  # (B, nh, T, S, Lm)
    z = p.sum(-1, keepdim=True).clamp_(min=1.0)  # Z_c·e^{−m_c} ≥ 1 (an empty slot's 0 → 1; zeroed below)
    p.div_(z)
    log_z = z.log_().squeeze(-1)  # (B, nh, T, S)
    lse = m.squeeze(-1) + log_z
    h = log_z - x.mul_(p).sum(-1)  # H(p_c); x is spent (in place: no second big buffer)
    slot = memory.slot_mask  # (B, S)
    if not bool(slot.all()):  # slots beyond an input's |R| (or R = ∅): no mass, Z_c = 0
        p.mul_(slot[:, None, None, :, None])
        lse.masked_fill_(~slot[:, None, None, :], -math.inf)
        h.masked_fill_(~slot[:, None, None, :], 0.0)
    return MemorySoftmax(p, lse, h, x)


def gates(alpha: torch.Tensor, joint: torch.Tensor, *, has_memory: torch.Tensor, weight: torch.Tensor,
          lse_in: torch.Tensor, lse_mem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g_in (B, nh, T), g_c (B, nh, T, S)) of out_i = g_in·attn_intra(i) + Σ_c g_c·attn_c(i).

    fixed: g_in = α, g_c = (1−α)·w_db(c); joint: g_in = Z_in/Z, g_c = Z_c/Z. alpha (B,), joint (B,)
    bool, has_memory (B,) bool (R ≠ ∅; an input without memory gets g_in = 1), weight (B, S) w_db,
    lse_in (B, nh, T), lse_mem (B, nh, T, S). Joint-mode gates are computed only when some input
    asks for joint mode.
    """
    B, nh, T, S = lse_mem.shape
    a = torch.where(has_memory, alpha.to(lse_in.dtype), torch.ones_like(alpha, dtype=lse_in.dtype))  # (B,)
    any_joint, all_joint = bool(joint.any()), bool(joint.all())
    if not all_joint:  # fixed: g_in = α, g_c = (1−α)·w_db(c)
        gate_in = a[:, None, None].expand(B, nh, T)
        gate_mem = ((1 - a)[:, None] * weight.to(lse_in.dtype))[:, None, None, :].expand(B, nh, T, S)
    if any_joint:  # joint: each part's share of the joint partition function
        lse_all = torch.logsumexp(torch.cat([lse_in[..., None], lse_mem], -1), -1)  # (B, nh, T)
        g_in_joint = torch.exp(lse_in - lse_all)
        g_mem_joint = torch.exp(lse_mem - lse_all[..., None])  # (B, nh, T, S)
        if all_joint:
            gate_in, gate_mem = g_in_joint, g_mem_joint
        else:
            j = joint[:, None, None]
            gate_in = torch.where(j, g_in_joint, gate_in)
            gate_mem = torch.where(j[..., None], g_mem_joint, gate_mem)
    return gate_in, gate_mem


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    memory: MemoryBatch,
    *,
    alpha: torch.Tensor,
    joint: torch.Tensor,
    scaling: float,
) -> FusedResult:
    """Fast, batched fused attention. q, k, v (B, nh, T, hs); mask (B, T) bool; alpha (B,); joint (B,) bool.

    The input's own softmax, each chunk's softmax (`memory_softmax`) and the gates (`gates`); then
    Σ_c g_c·attn_c as one matmul of the gated weights with all memory values. The per-chunk
    attn_c is computed only when evidence asks (`FusedResult.slot_attention`).
    `fused_attention_reference` is the plain loop version; tests/core/test_attention.py compares
    every field.
    """
    B, nh, T, hs = q.shape
    S, Lm = memory.token_mask.shape[1:]
    qs = q * scaling
    s_in = qs @ k.transpose(-1, -2)  # (B, nh, T, T)
    s_in.masked_fill_(~mask[:, None, None, :], -math.inf)
    lse_in = torch.logsumexp(s_in, -1)  # (B, nh, T)
    p_in = torch.exp(s_in - lse_in[..., None])  # (B, nh, T, T)
    attn_in = p_in @ v  # (B, nh, T, hs)
    h_in = entropy(p_in)  # (B, nh, T)

    mem = memory_softmax(qs, memory)
    gate_in, gate_mem = gates(alpha, joint, has_memory=memory.slot_mask.any(-1), weight=memory.weight,
                              lse_in=lse_in, lse_mem=mem.lse)

    gp = torch.mul(mem.p, gate_mem[..., None], out=mem.scratch).view(B, nh, T, S * Lm)  # g_c·p_c
    mem_out = gp @ memory.value.reshape(B, nh, S * Lm, hs)  # (B, nh, T, hs) Σ_c g_c·attn_c
    out = gate_in[..., None] * attn_in + mem_out  # (B, nh, T, hs)
    # chain rule: H(fused) = H(gates) + g_in·H(p_in) + Σ_c g_c·H(p_c)
    h_gates = torch.special.entr(gate_in) + entropy(gate_mem)
    h = h_gates + gate_in * h_in + (gate_mem * mem.entropy).sum(-1)
    return FusedResult(out, attn_in, mem.p, gate_in, gate_mem, h, h_in, mem.lse, memory.value, mem_out)


def fused_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    chunks: list[list[tuple[torch.Tensor, torch.Tensor]]],
    weights: list[list[float]],
    alpha: list[float],
    joint: list[bool],
    scaling: float,
) -> torch.Tensor:
    """The formulas above, one input, head and query at a time, in float64.

    chunks[b] lists (k_c, v_c), each (nh, n_c, hs), of input b's retrieved chunks; weights[b] their
    w_db. Returns out (B, nh, T, hs); pad query positions are left zero.
    """
    B, nh, T, hs = q.shape
    out = torch.zeros(B, nh, T, hs, dtype=torch.float64)
    for b in range(B):
        valid = mask[b].nonzero().flatten()
        for h in range(nh):
            k_in, v_in = k[b, h, valid].double(), v[b, h, valid].double()  # (n, hs)
            for i in valid.tolist():
                qi = q[b, h, i].double()  # (hs,)
                s_in = (k_in @ qi) * scaling
                if not chunks[b]:
                    out[b, h, i] = torch.softmax(s_in, 0) @ v_in
                elif joint[b]:
                    ks = torch.cat([k_in] + [kc[h].double() for kc, _ in chunks[b]])
                    vs = torch.cat([v_in] + [vc[h].double() for _, vc in chunks[b]])
                    out[b, h, i] = torch.softmax((ks @ qi) * scaling, 0) @ vs
                else:
                    intra = torch.softmax(s_in, 0) @ v_in
                    db = torch.zeros(hs, dtype=torch.float64)
                    for (kc, vc), w in zip(chunks[b], weights[b], strict=True):
                        db += w * (torch.softmax((kc[h].double() @ qi) * scaling, 0) @ vc[h].double())
                    out[b, h, i] = alpha[b] * intra + (1 - alpha[b]) * db
    return out


# --- the hook: where the model's attention dispatch reaches the memory layer (softknn.model.encoder) ---
ATTN_IMPLEMENTATION = "softknn"
_HOOK: contextvars.ContextVar = contextvars.ContextVar("softknn_layer_hook", default=None)


def _softknn_attention(module, query, key, value, attention_mask, **kwargs):
    """The registered attention: SDPA, unless the active hook is bound to this module."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    hook = _HOOK.get()
    if hook is not None and module is hook.module:
        return hook(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, _softknn_attention)
    # Without a mask function transformers hands a custom attention attention_mask=None and
    # padding leaks into every token (measured: max |Δembedding| 0.083 on a padded pair).
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


class CaptureKV:
    """Hook that records a layer's query/key/value (B, nh, T, hs) and runs plain SDPA: bound with
    bind_hook, the capture of the builder, of the plain pass and of the ONNX export."""

    def __init__(self, module):
        self.module = module
        self.query: torch.Tensor | None = None
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.query, self.key, self.value = query, key, value
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def bind_hook(hook):
    """A context manager that makes `hook` the active attention hook (None: none) of this thread or
    task: the registered attention calls it at `hook.module`, plain SDPA everywhere else."""

    class _Bound:
        def __enter__(self):
            self.token = _HOOK.set(hook)
            return hook

        def __exit__(self, *exc):
            _HOOK.reset(self.token)

    return _Bound()
