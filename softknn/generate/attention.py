"""The generator's memory attention: a causal LM's query tokens attend to their own context and to
the retrieved chunks' precomputed keys/values, by the α rule or one joint softmax, and a plain
per-head loop of the same formulas beside it.

Per memory layer, kv head h', query row i (a query head of h''s group at one position):

    attn_intra(i) = softmax_j(q_i·k_j·scale + causal mask) · V_ctx      (the model's own attention)
    attn_c(i)     = softmax_{t∈c}(q_i·k_t·scale) · V_c                   (chunk c's precomputed K/V)
    fixed:  out_i = α·attn_intra(i) + (1−α)·Σ_c w_db(c)·attn_c(i)
    joint:  out_i = softmax over [tokens of R ; own context](q_i·k·scale + log π_c) · [V_R ; V_ctx]
            = g_in·attn_intra(i) + Σ_c g_c·attn_c(i),  g_in = Z_in/Z, g_c = π_c·Z_c/Z
            π_c = (|R|·w_db(c))^β / mean_c' (|R|·w_db(c'))^β

β (`prior`) lets the outer k-NN's weights into the one softmax as a prior on each chunk's tokens, and
only between the chunks: the factors π_c average 1, so the prior moves attention from the chunks the
retrieval trusts less to those it trusts more, not from the prompt's own tokens to the KB. β = 0 is the
plain joint softmax (the masked-concatenation contract); with uniform w_db any β is.

Grouped-query attention: the 9 query heads of SmolLM2 share 3 key/value heads, and the memory
stores the key/value heads (what the model's own cache holds), so a query head reads its group's
memory heads, as `repeat_kv` does for the context. Keys are stored after the rotary embedding, at
the positions `place_memory` gives them (docs/design.md, "Generation").
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from softknn.common.table import MIXING, POSITIONS  # noqa: F401 (re-exported)

GEN_ATTN_IMPLEMENTATION = "softknn_gen"

_HOOK: contextvars.ContextVar = contextvars.ContextVar("softknn_gen_hook", default=None)


@dataclass
class LayerMemory:
    """One memory layer's keys/values of the retrieved chunks, padded to S slots of Lm tokens."""

    key: torch.Tensor  # (nkv, S, Lm, hs) post-RoPE keys at their placed positions
    value: torch.Tensor  # (nkv, S, Lm, hs)


@dataclass
class GenMemory:
    """What a generation attends to beside its context: R's K/V at each memory layer."""

    layers: dict[int, LayerMemory]
    token_mask: torch.Tensor  # (S, Lm) bool, True on real chunk tokens
    weight: torch.Tensor  # (S,) w_db, sums to 1
    lengths: list[int]  # n_c of each slot
    prompt_start: int  # the position of the first prompt token after the prefix
    prefix_len: int = 0  # the prompt's first prefix_len tokens come before the KB (positions 0..prefix_len−1)

    @property
    def slots(self) -> int:
        return len(self.lengths)


@dataclass
class Trace:
    """Per generated token, what the memory layers gave the memory (means over heads and layers).

    `mass[t][c]`: the gate g_c that weighted chunk c's values for the query that produced token t;
    `share[t][c]`: Z_c/Z, the joint-softmax share (what the query's scores alone give c; equal to the
    mass in joint mixing); `token_mass[c]`: (Lm,) Σ_t of g_c·p_c(token) — which chunk tokens drew it.
    """

    mass: list[torch.Tensor] = field(default_factory=list)  # each (S,)
    share: list[torch.Tensor] = field(default_factory=list)  # each (S,)
    token_mass: torch.Tensor | None = None  # (S, Lm)
    attention_entropy: list[float] = field(default_factory=list)  # H of the normalised chunk mass per token
    _step: dict = field(default_factory=dict)  # layer -> (mass, share, token_mass) of the current step

    def begin_step(self) -> None:
        self._step = {}

    def end_step(self) -> None:
        if not self._step:
            return
        mass = torch.stack([m for m, _, _ in self._step.values()]).mean(0)  # (S,)
        share = torch.stack([s for _, s, _ in self._step.values()]).mean(0)
        tok = torch.stack([t for _, _, t in self._step.values()]).mean(0)  # (S, Lm)
        self.mass.append(mass)
        self.share.append(share)
        self.token_mass = tok if self.token_mass is None else self.token_mass + tok
        p = mass / mass.sum().clamp(min=1e-30)
        self.attention_entropy.append(float(torch.special.entr(p).sum()))
        self._step = {}


def log_prior(weight: torch.Tensor, beta: float) -> torch.Tensor:
    """(S,) float64 log π_c = β·log(S·w_db(c)) − log mean_c' (S·w_db(c'))^β: the k-NN prior's factors on
    the chunks' shares of the joint softmax, averaging 1 (module doc). All 0 for β = 0 or uniform w_db."""
    lp = beta * torch.log(weight.double().clamp(min=1e-30) * weight.shape[0])
    return lp - (torch.logsumexp(lp, 0) - math.log(weight.shape[0]))


def _softknn_gen_attention(module, query, key, value, attention_mask, **kwargs):
    """The registered attention: plain SDPA, unless a memory hook is bound and covers this layer."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    hook = _HOOK.get()
    if hook is not None and hook.covers(module.layer_idx):
        return hook(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _mask_always(*args, **kwargs):
    """transformers' SDPA mask, never skipped: the memory hook needs the causal mask as a tensor."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_gen_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(GEN_ATTN_IMPLEMENTATION, _softknn_gen_attention)
    AttentionMaskInterface.register(GEN_ATTN_IMPLEMENTATION, _mask_always)


class bind:
    """`with bind(hook):` — the memory hook the generator's attention uses in this thread/context."""

    def __init__(self, hook):
        self.hook = hook

    def __enter__(self):
        self.token = _HOOK.set(self.hook)
        return self.hook

    def __exit__(self, *exc):
        _HOOK.reset(self.token)


def _own_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scaling: float, groups: int) -> torch.Tensor:
    """q (B, nkv, g·T, hs) grouped, k (B, nkv, Tk, hs), mask (B, 1, T, Tk) bool or additive → (B, nkv, g·T, Tk)."""
    s = (q @ k.transpose(-1, -2)) * scaling  # (B, nkv, gT, Tk)
    if mask is not None:
        m = mask.repeat(1, 1, groups, 1)  # (B, 1, gT, Tk): row gi·T + t is position t's mask
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m
    return s


class MemoryHook:
    """Replaces the attention of the memory layers by the fused computation (module doc).

    mixing "fixed" uses α and w_db; "joint" one softmax. `trace` (optional) records, for the last query
    position of each forward (the one whose output predicts the next token), the gates per chunk.
    """

    def __init__(self, memory: GenMemory, *, mixing: str, alpha: float, trace: Trace | None = None,
                 prior: float = 0.0):
        if mixing not in MIXING:
            raise ValueError(f"mixing must be one of {MIXING}, not {mixing!r}")
        if prior < 0:
            raise ValueError(f"prior must be ≥ 0, not {prior}")
        self.memory = memory
        self.mixing = mixing
        self.alpha = float(alpha)
        self.trace = trace
        # joint only: log π_c, the prior factor on each chunk's partition function (module doc)
        self.log_prior = log_prior(memory.weight, prior).float() if prior and mixing == "joint" else None
        # the prompt's first rows that come before the KB (its prefix) attend to their own past only;
        # the generator sets this for the prefill and clears it for the decoding steps
        self.skip_rows = 0

    def _reads_memory(self, T: int, groups: int, device) -> torch.Tensor | None:
        """(g·T,) bool: which grouped query rows read the memory (None: all)."""
        if self.skip_rows <= 0:
            return None
        return (torch.arange(T, device=device) >= self.skip_rows).repeat(groups)

    def covers(self, layer: int) -> bool:
        return layer in self.memory.layers

    def __call__(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        B, nh, T, hs = query.shape
        nkv = key.shape[1]
        g = nh // nkv
        scaling = hs**-0.5 if scaling is None else scaling
        mem = self.memory.layers[module.layer_idx]
        S, Lm = self.memory.token_mask.shape
        qg = query.reshape(B, nkv, g * T, hs)  # query head h = h'·g + j reads kv head h'
        s_in = _own_scores(qg, key, attention_mask, scaling, g)  # (B, nkv, gT, Tk)
        lse_in = torch.logsumexp(s_in, -1)  # (B, nkv, gT)
        attn_in = torch.exp(s_in - lse_in[..., None]) @ value  # (B, nkv, gT, hs)
        s_m = (qg @ mem.key.reshape(nkv, S * Lm, hs).transpose(-1, -2)) * scaling  # (B, nkv, gT, S·Lm)
        s_m = s_m.view(B, nkv, g * T, S, Lm).masked_fill(~self.memory.token_mask, -math.inf)
        lse_c = torch.logsumexp(s_m, -1)  # (B, nkv, gT, S)
        p_c = torch.exp(s_m - lse_c[..., None])  # (B, nkv, gT, S, Lm), 0 on pad tokens
        if self.log_prior is not None:
            lse_c = lse_c + self.log_prior  # (S,) broadcast: π_c·Z_c
        reads = self._reads_memory(T, g, query.device)  # (gT,) or None
        if reads is not None:
            lse_c = lse_c.masked_fill(~reads[:, None], -math.inf)  # prefix rows: no memory mass
        lse_all = torch.logsumexp(torch.cat([lse_in[..., None], lse_c], -1), -1)  # (B, nkv, gT)
        share = torch.exp(lse_c - lse_all[..., None])  # (B, nkv, gT, S) Z_c/Z
        if self.mixing == "joint":
            g_in, g_c = torch.exp(lse_in - lse_all), share
        else:
            g_in = torch.full_like(lse_in, self.alpha)
            g_c = ((1 - self.alpha) * self.memory.weight.to(query.dtype)).expand(B, nkv, g * T, S)
            if reads is not None:
                g_in = torch.where(reads, g_in, torch.ones_like(g_in))
                g_c = g_c * reads[:, None]
        gp = (g_c[..., None] * p_c).view(B, nkv, g * T, S * Lm)
        out = g_in[..., None] * attn_in + gp @ mem.value.reshape(nkv, S * Lm, hs)  # (B, nkv, gT, hs)
        if self.trace is not None:
            rows = torch.arange(g, device=query.device) * T + (T - 1)  # the last position, every head of a group
            tok = (g_c[..., None] * p_c)[:, :, rows].mean((0, 1, 2))  # (S, Lm)
            self.trace._step[module.layer_idx] = (g_c[:, :, rows].mean((0, 1, 2)), share[:, :, rows].mean((0, 1, 2)), tok)
        out = out.view(B, nkv, g, T, hs).reshape(B, nh, T, hs)
        return out.transpose(1, 2).contiguous(), None  # (B, T, nh, hs), as the attention interface returns


class ReferenceHook(MemoryHook):
    """The same formulas, one query head and position at a time, in float64 (tests compare)."""

    def __call__(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        B, nh, T, hs = query.shape
        nkv, Tk = key.shape[1], key.shape[2]
        g = nh // nkv
        scaling = hs**-0.5 if scaling is None else scaling
        mem = self.memory.layers[module.layer_idx]
        out = torch.zeros(B, nh, T, hs, dtype=torch.float64)
        for b in range(B):
            for h in range(nh):
                kv = h // g
                for i in range(T):
                    qi = query[b, h, i].double()
                    allowed = torch.ones(Tk, dtype=torch.bool) if attention_mask is None else (
                        attention_mask[b, 0, i] if attention_mask.dtype == torch.bool else attention_mask[b, 0, i] == 0)
                    k_in, v_in = key[b, kv][allowed].double(), value[b, kv][allowed].double()
                    s_in = (k_in @ qi) * scaling
                    if i < self.skip_rows:  # a prefix row: its own past only
                        out[b, h, i] = torch.softmax(s_in, 0) @ v_in
                        continue
                    parts_s, parts_v = [s_in], [v_in]
                    for c, n in enumerate(self.memory.lengths):
                        bias = float(self.log_prior[c]) if self.log_prior is not None else 0.0
                        parts_s.append((mem.key[kv, c, :n].double() @ qi) * scaling + bias)
                        parts_v.append(mem.value[kv, c, :n].double())
                    if self.mixing == "joint":
                        out[b, h, i] = torch.softmax(torch.cat(parts_s), 0) @ torch.cat(parts_v)
                    else:
                        db = torch.zeros(hs, dtype=torch.float64)
                        for c in range(len(self.memory.lengths)):
                            db += float(self.memory.weight[c]) * (torch.softmax(parts_s[c + 1], 0) @ parts_v[c + 1])
                        out[b, h, i] = self.alpha * (torch.softmax(s_in, 0) @ v_in) + (1 - self.alpha) * db
        return out.to(query.dtype).transpose(1, 2).contiguous(), None


VOTE_WINDOW = 16  # SnapKV's observation window: the last tokens of a chunk vote for the tokens it keeps


class VoteHook:
    """At every layer, the model's own attention (SDPA, unchanged) and beside it the votes: for each
    sequence of the batch (real tokens P + n_j, right-padded), the attention probabilities its last
    VOTE_WINDOW rows pay to each column, summed over heads and layers: votes (B, T)."""

    def __init__(self, prefix_len: int, lengths: list[int]):
        self.P, self.lengths = prefix_len, lengths
        self.votes: torch.Tensor = torch.zeros(0)

    def covers(self, layer: int) -> bool:
        return True

    def __call__(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        B, nh, T, hs = query.shape
        g = nh // key.shape[1]
        scaling = hs**-0.5 if scaling is None else scaling
        k = key.repeat_interleave(g, 1)  # (B, nh, Tk, hs): query head h reads kv head h // g
        s = (query @ k.transpose(-1, -2)) * scaling  # (B, nh, T, Tk)
        if attention_mask is not None:
            s = s.masked_fill(~attention_mask, -math.inf) if attention_mask.dtype == torch.bool else s + attention_mask
        p = torch.softmax(s.float(), -1)
        if self.votes.numel() == 0:
            self.votes = torch.zeros(B, key.shape[2])
        for j, n in enumerate(self.lengths):
            end = self.P + n
            self.votes[j] += p[j, :, max(self.P, end - VOTE_WINDOW) : end].sum((0, 1))
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def rotate_keys(key: torch.Tensor, offset: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE keys (..., n, hs) moved `offset` positions later: k·cos(oθ) + rotate_half(k)·sin(oθ).

    Exact for RoPE of fixed frequencies (softknn.generate.families.ROPE_TYPES): R(p+o) = R(o)·R(p), and a
    stored key that carries YaRN's cos/sin factor s keeps it, s·R(p+o)k = R(o)·(s·R(p)k), so the offset's
    rotation is unscaled. The Llama / Qwen2 / Mistral layout (rotate_half over the two halves of the head)."""
    if offset == 0:
        return key
    freqs = offset * inv_freq.double()  # (hs/2,)
    emb = torch.cat([freqs, freqs])  # (hs,)
    cos, sin = emb.cos().to(key.dtype), emb.sin().to(key.dtype)
    half = key.shape[-1] // 2
    rot = torch.cat([-key[..., half:], key[..., :half]], -1)
    return key * cos + rot * sin


def place_memory(chunks: list[torch.Tensor], layers: list[int], weight: torch.Tensor, positions: str,
                 inv_freq: torch.Tensor | None, *, encoded_after: int | list[int] = 0, prefix_len: int = 0,
                 extents: list[int] | None = None) -> GenMemory:
    """GenMemory from R's chunk K/V, each (n_c, n_layers, 2, nkv, hs), encoded after a prefix of
    `encoded_after` tokens (positions encoded_after..encoded_after+n_c−1, Generator.chunk_kv), for a
    prompt whose first `prefix_len` tokens precede the KB (P = prefix_len).

    composite (TurboRAG's composite positions): every chunk at P..P+n_c−1; the rest of the prompt
    starts at P + max n_c. reordered: chunk c at P + Σ_{c'<c} n_c' (as if the chunks were
    concatenated in rank order); the rest starts at P + Σ n_c. Keys are rotated by the difference
    between where they were encoded and where they are placed: exact where a chunk sees nothing but
    itself (RoPE is relative); a chunk that saw a prefix keeps its distance to it as encoded, so
    reordered placement after a prefix is exact only for chunks encoded at their placed positions
    (`encoded_after` per chunk, Generator.chunk_kv's `starts`).

    `extents`: the positions each chunk spans (default its stored length). A chunk stored with token
    selection (ChunkKV.extent) keeps its tokens' own positions, so it spans its whole length: the
    prompt starts after the last position any chunk could hold, never among the kept keys."""
    lengths = [int(c.shape[0]) for c in chunks]
    shifts, start = placement(lengths, positions, encoded_after=encoded_after, prefix_len=prefix_len, extents=extents)
    S, Lm = len(chunks), max(lengths)
    nkv, hs = chunks[0].shape[-2], chunks[0].shape[-1]
    mask = torch.zeros(S, Lm, dtype=torch.bool)
    keys = torch.zeros(len(layers), nkv, S, Lm, hs)
    values = torch.zeros(len(layers), nkv, S, Lm, hs)
    for c, kv in enumerate(chunks):
        n = lengths[c]
        mask[c, :n] = True
        k = kv[:, :, 0].permute(1, 2, 0, 3)  # (n_layers, nkv, n, hs)
        if shifts[c]:
            if inv_freq is None:
                raise ValueError("moving memory keys needs the model's rotary frequencies")
            k = rotate_keys(k, shifts[c], inv_freq)
        keys[:, :, c, :n] = k
        values[:, :, c, :n] = kv[:, :, 1].permute(1, 2, 0, 3)
    return GenMemory({layer: LayerMemory(keys[j], values[j]) for j, layer in enumerate(layers)}, mask,
                     weight.float(), lengths, start, prefix_len)


def placement(lengths: list[int], positions: str, *, encoded_after: int | list[int] = 0, prefix_len: int = 0,
              extents: list[int] | None = None) -> tuple[list[int], int]:
    """Where place_memory puts R (its docstring): each chunk's key shift (placed − encoded position of its
    first token) and the position of the prompt's first token after the prefix."""
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, not {positions!r}")
    spans = lengths if extents is None else [max(int(e), n) for e, n in zip(extents, lengths, strict=True)]
    shifts, offset = [], 0
    for c in range(len(lengths)):
        at = encoded_after[c] if isinstance(encoded_after, list) else encoded_after
        shifts.append(prefix_len - at + (offset if positions == "reordered" else 0))
        offset += spans[c]
    return shifts, prefix_len + (offset if positions == "reordered" else max(spans))


def chunk_positions(lengths: list[int], positions: str, base: int = 0) -> list[list[int]]:
    """Each chunk's token positions under the placement (the masked reference's position ids)."""
    out, offset = [], 0
    for n in lengths:
        start = base + (offset if positions == "reordered" else 0)
        out.append(list(range(start, start + n)))
        offset += n
    return out


class PromptLayout(Protocol):
    prefix_len: int
    prompt_start: int


def prompt_positions(n: int, memory: PromptLayout | None) -> torch.Tensor:
    """(n,) position ids of a prompt: 0..n−1 without memory; with it, the prefix at 0..|P|−1 and the
    rest from memory.prompt_start, after the chunks."""
    if memory is None:
        return torch.arange(n)
    P = memory.prefix_len
    return torch.cat([torch.arange(min(P, n)), memory.prompt_start + torch.arange(max(n - P, 0))])
