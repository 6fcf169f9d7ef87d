"""Memory representations: what a bundle stores to give the memory layer its K/V.

The fused attention needs, for every retrieved chunk, its memory tokens' layer-L keys and values
(nh, n_c, hs). A bundle can store them in one of these forms, chosen at build time and named in
the manifest's `memory` field (a build stores DEFAULT_MEMORY, `hidden`, unless told otherwise; a
bundle without the field, built before it existed, is `kv`):

    kv           kv_keys.npy, kv_values.npy (Ntok, nh, hs): the K/V themselves (float32, or the
                 build's --kv-dtype), 2·C values per token
    hidden       mem_hidden.npy (Ntok, C) float32: layer L's *input* hidden states; k, v are
                 recomputed for the retrieved rows only with the layer's own key/value Linear
                 (Encoder.project_kv): half the bytes, same answers up to float round-off.
                 The projection is torch's Linear whatever runs the plain forward (ONNX Runtime
                 gives the layers before L and the query's own Q/K/V; the stored states and so
                 the memory's K/V do not depend on the serving runtime)
    hidden-fp16  the same states in float16 (a quarter)
    hidden-int8  the same states in int8 with one symmetric scale per channel,
                 mem_hidden_scale.npy (C,) float32: h ≈ q·scale, q = round(h / scale),
                 scale_c = max_t |h_tc| / 127 (an eighth of kv, plus C floats)
    recompute    nothing: layers 0..L run over the retrieved chunks' texts at query time
                 (Encoder.capture_kv) to get their K/V

Every store answers the same interface — `count`/`start` (token rows per chunk), `chunk(c)`,
`gather(ids, weights, device)` (the fast path) and `gather_reference` (one chunk at a time), and
`attach(encoder, layer)` (the model the non-`kv` stores compute K/V with) — and `load_memory`
is the one loader, so a caller (the engine, a shard) never looks at the representation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from softknn.common.errors import BundleError
from softknn.model.attention import MemoryBatch
from softknn.model.backends import MemoryStore  # noqa: F401 (re-exported: what load_memory returns)
from softknn.storage.manifest import Manifest

MEMORY_KINDS = ("kv", "hidden", "hidden-fp16", "hidden-int8", "recompute")
# What a build stores unless told otherwise: K/V equal to kv's to float round-off (measured bit-identical)
# in half the bytes (docs/benchmarks.md "Compact memory"); a manifest without `memory` is still kv.
DEFAULT_MEMORY = "hidden"
HIDDEN_DTYPES = {"hidden": np.float32, "hidden-fp16": np.float16, "hidden-int8": np.int8}
INT8_SCALE = "mem_hidden_scale.npy"
MEMORY_FILES = {
    "kv": ("kv_keys.npy", "kv_values.npy"),
    "hidden": ("mem_hidden.npy",),
    "hidden-fp16": ("mem_hidden.npy",),
    "hidden-int8": ("mem_hidden.npy", "mem_hidden_scale.npy"),
    "recompute": (),
}


class KVStore:
    """Per chunk, its non-special tokens' layer-L keys and values, and their char spans.

    keys/values (Ntok, nh, hs) memory-mapped; chunk c owns rows start[c] : start[c] + count[c].
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray, start: np.ndarray, count: np.ndarray):
        assert keys.shape == values.shape and keys.ndim == 3, (keys.shape, values.shape)
        self.keys, self.values = keys, values
        self.start, self.count = start, count
        self.num_heads, self.head_dim = keys.shape[1], keys.shape[2]

    def chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k_c, v_c (nh, n_c, hs) float32."""
        s, n = int(self.start[c]), int(self.count[c])
        kc = torch.from_numpy(np.array(self.keys[s : s + n], dtype=np.float32))  # (n, nh, hs)
        vc = torch.from_numpy(np.array(self.values[s : s + n], dtype=np.float32))
        return kc.transpose(0, 1), vc.transpose(0, 1)

    def rows(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) float32 of store rows `rows` (one fancy-index read each)."""
        return (torch.from_numpy(np.asarray(self.keys[rows], dtype=np.float32)),
                torch.from_numpy(np.asarray(self.values[rows], dtype=np.float32)))

    def attach(self, encoder, layer: int) -> None:
        """Stored K/V need no model (the hidden-state and recompute memories do: softknn.storage.memory_stores)."""

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """Pad each input's chunks into a MemoryBatch: S = max |R|, Lm = the longest chunk.

        One fancy-index read of all retrieved token rows and one scatter straight into the padded
        (B, nh, S, Lm, hs) layout, instead of a copy per chunk into (B, S, Lm, nh, hs) followed by
        a permuted copy of the whole padded tensor. `gather_reference` is the per-chunk loop;
        tests compare the two.
        """
        return pad_memory(ids, weights, self.start, self.count, self.num_heads, self.head_dim, device, self.rows)

    def gather_reference(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """`gather` as a plain loop, one chunk at a time (the reference its tests compare with)."""
        def chunk(c: int) -> tuple[torch.Tensor, torch.Tensor]:
            st, n = int(self.start[c]), int(self.count[c])
            return (torch.from_numpy(np.array(self.keys[st : st + n], dtype=np.float32)),
                    torch.from_numpy(np.array(self.values[st : st + n], dtype=np.float32)))

        return pad_memory_reference(ids, weights, self.count, self.num_heads, self.head_dim, device, chunk)


RowsFn = Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]  # store rows -> k, v (n, nh, hs) float32


def pad_memory(ids: list[list[int]], weights: list[list[float]], start: np.ndarray, count: np.ndarray,
               nh: int, hs: int, device: torch.device, kv_rows: RowsFn) -> MemoryBatch:
    """The MemoryBatch of R = ids (per input, chunk rows) from any memory representation: `kv_rows`
    gives the K/V of all retrieved token rows in one call; they are scattered into (B, nh, S, Lm, hs)."""
    B = len(ids)
    S = max(1, max((len(r) for r in ids), default=1))
    counts = [[int(count[c]) for c in r] for r in ids]
    Lm = max(1, max((n for r in counts for n in r), default=1))
    bi, si, li, src = [], [], [], []  # per retrieved token: its (input, slot, position), its store row
    for b, (row, cnt) in enumerate(zip(ids, counts, strict=True)):
        for s, (c, n) in enumerate(zip(row, cnt, strict=True)):
            st = int(start[c])
            src.append(np.arange(st, st + n))
            li.append(np.arange(n))
            bi.append(np.full(n, b))
            si.append(np.full(n, s))
    key = torch.zeros(B, nh, S, Lm, hs)  # written in place through a (B, S, Lm, nh, hs) view: no permute copy
    value = torch.zeros(B, nh, S, Lm, hs)
    token_mask = torch.zeros(B, S, Lm, dtype=torch.bool)
    weight = torch.zeros(B, S)
    if src:
        at = tuple(torch.from_numpy(np.concatenate(x)) for x in (bi, si, li))
        k, v = kv_rows(np.concatenate(src))  # (n, nh, hs) each
        key.permute(0, 2, 3, 1, 4)[at] = k.to("cpu", torch.float32)
        value.permute(0, 2, 3, 1, 4)[at] = v.to("cpu", torch.float32)
        token_mask[at] = True
    for b, w in enumerate(weights):
        weight[b, : len(w)] = torch.tensor(w, dtype=torch.float32)
    return MemoryBatch(key=key.to(device), value=value.to(device), token_mask=token_mask.to(device),
                       weight=weight.to(device))


def pad_memory_reference(ids: list[list[int]], weights: list[list[float]], count: np.ndarray, nh: int, hs: int,
                         device: torch.device, kv_chunk: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> MemoryBatch:
    """`pad_memory` as a plain loop: `kv_chunk(c)` gives chunk c's k, v (n_c, nh, hs), one chunk at a time."""
    B = len(ids)
    S = max(1, max((len(r) for r in ids), default=1))
    Lm = max(1, max((int(count[c]) for r in ids for c in r), default=1))
    key = torch.zeros(B, S, Lm, nh, hs)
    value = torch.zeros(B, S, Lm, nh, hs)
    token_mask = torch.zeros(B, S, Lm, dtype=torch.bool)
    weight = torch.zeros(B, S)
    for b, row in enumerate(ids):
        for s, c in enumerate(row):
            n = int(count[c])
            kc, vc = kv_chunk(c)
            key[b, s, :n], value[b, s, :n] = kc.float().cpu(), vc.float().cpu()
            token_mask[b, s, :n] = True
            weight[b, s] = weights[b][s]
    return MemoryBatch(
        key=key.permute(0, 3, 1, 2, 4).contiguous().to(device),  # (B, nh, S, Lm, hs)
        value=value.permute(0, 3, 1, 2, 4).contiguous().to(device),
        token_mask=token_mask.to(device),
        weight=weight.to(device),
    )


def memory_kind(kind: str) -> str:
    """A bundle's memory representation, checked (bundles built before the field existed store `kv`)."""
    if kind not in MEMORY_KINDS:
        raise BundleError(f"manifest memory {kind!r} is not one of {MEMORY_KINDS}; a newer softknn built it?")
    return kind


def check_kind(kind: str) -> str:
    if kind not in MEMORY_KINDS:
        raise ValueError(f"memory must be one of {', '.join(MEMORY_KINDS)}, not {kind!r}")
    return kind


def check_kv_dtype(kind: str, kv_dtype: str) -> None:
    """--kv-dtype sets the dtype of stored K/V: it means nothing to another memory (ValueError)."""
    if kind != "kv" and kv_dtype != "float32":
        raise ValueError(f"kv_dtype {kv_dtype!r} applies to memory 'kv' only; memory {kind!r} sets its own dtype "
                         "(build with --memory kv to store float16 K/V, or --memory hidden-fp16)")


def memory_files(kind: str) -> tuple[str, ...]:
    return MEMORY_FILES[memory_kind(kind)]


def memory_summary(m: Manifest) -> dict:
    """What /v1/index and `softknn info` say of the memory: its kind, files and bytes per chunk."""
    kind = memory_kind(m.memory)
    n = max(1, m.counts.chunks)
    nbytes = sum(m.files[f].bytes for f in MEMORY_FILES[kind] if f in m.files)
    return {"kind": kind, "files": list(MEMORY_FILES[kind]), "bytes": nbytes, "bytes_per_chunk": round(nbytes / n, 1),
            "computed_at_query_time": {"kv": "nothing", "recompute": "layers 0..L over the retrieved chunks"}.get(
                kind, "K/V from the stored hidden states (the layer's key/value projections)")}


def quantize_int8(h: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """q (n, C) int8 = round(h / scale) clipped to ±127; scale (C,) > 0."""
    return np.clip(np.rint(h / scale), -127, 127).astype(np.int8)


def int8_scale(absmax: np.ndarray) -> np.ndarray:
    """Per-channel symmetric scale (C,) float32 from each channel's max |h| (1 where a channel is all 0)."""
    return np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)


class _Attached:
    """The encoder and layer a computed memory uses; refuses to run before `attach`."""

    encoder = None
    layer: int | None = None
    num_heads: int  # declared by the memory classes this mixes into
    head_dim: int

    def attach(self, encoder, layer: int) -> None:
        info = encoder.info
        if (info.num_heads, info.head_dim) != (self.num_heads, self.head_dim):
            raise BundleError(f"memory of {self.num_heads}×{self.head_dim} heads, model {info.num_heads}×{info.head_dim}")
        self.encoder, self.layer = encoder, int(layer)

    def _need(self):
        if self.encoder is None:
            raise BundleError(f"{type(self).__name__}: attach(encoder, layer) first: this memory computes its K/V with the model")
        return self.encoder


class HiddenStore(_Attached):
    """Per chunk, its memory tokens' layer-L input hidden states (Ntok, C), float32/float16/int8."""

    def __init__(self, hidden: np.ndarray, scale: np.ndarray | None, start: np.ndarray, count: np.ndarray,
                 num_heads: int, head_dim: int):
        assert hidden.ndim == 2 and hidden.shape[1] == num_heads * head_dim, (hidden.shape, num_heads, head_dim)
        assert (scale is None) == (hidden.dtype != np.int8), "int8 states need their scale, others none"
        self.hidden, self.scale = hidden, scale
        self.start, self.count = start, count
        self.num_heads, self.head_dim = num_heads, head_dim

    def attach(self, encoder, layer: int) -> None:
        """As _Attached, and the model must have the key/value Linear to project with (refused at load, not per query)."""
        super().attach(encoder, layer)
        encoder.check_project_kv(int(layer))

    def states(self, rows: np.ndarray) -> torch.Tensor:
        """(n, C) float32 hidden states of store rows (dequantised: q·scale for int8)."""
        h = np.asarray(self.hidden[rows], dtype=np.float32)
        if self.scale is not None:
            h = h * self.scale
        return torch.from_numpy(h)

    def rows(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) of store rows: one projection of all of them."""
        return self._need().project_kv(self.layer, self.states(rows))

    def chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k_c, v_c (nh, n_c, hs) float32."""
        st, n = int(self.start[c]), int(self.count[c])
        k, v = self.rows(np.arange(st, st + n))
        return k.transpose(0, 1), v.transpose(0, 1)

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """K/V of every retrieved token row projected in one GEMM, then padded as KVStore.gather does."""
        return pad_memory(ids, weights, self.start, self.count, self.num_heads, self.head_dim, device, self.rows)

    def gather_reference(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """One chunk at a time: its states, then `key`/`value` of the layer written out as h·Wᵀ + b."""
        attn = self._need().attention_modules[self.layer]
        nh, hs = self.num_heads, self.head_dim

        def chunk(c: int) -> tuple[torch.Tensor, torch.Tensor]:
            st, n = int(self.start[c]), int(self.count[c])
            h = self.states(np.arange(st, st + n)).double()  # (n, C)
            k = h @ attn.key.weight.double().T + attn.key.bias.double()  # (n, nh·hs)
            v = h @ attn.value.weight.double().T + attn.value.bias.double()
            return k.view(n, nh, hs).float(), v.view(n, nh, hs).float()

        with torch.inference_mode():
            return pad_memory_reference(ids, weights, self.count, nh, hs, device, chunk)


class RecomputeStore(_Attached):
    """No stored memory: the retrieved chunks' texts run through layers 0..L at query time."""

    def __init__(self, texts: list[str], start: np.ndarray, count: np.ndarray, num_heads: int, head_dim: int):
        self.texts = texts
        self.start, self.count = start, count
        self.num_heads, self.head_dim = num_heads, head_dim

    def _kv(self, chunks: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """k, v (n_c, nh, hs) of each chunk, from one padded pass over their texts (tokenized as the build did)."""
        enc = self._need()
        batch = enc.tokenize([self.texts[c] for c in chunks], truncate=True)
        key, value = enc.capture_kv(batch, self.layer)  # (B, nh, T, hs)
        out = []
        for b, c in enumerate(chunks):
            idx = (~batch.special[b]).nonzero().flatten()  # the memory tokens, as the build chose them
            if len(idx) != int(self.count[c]):
                raise BundleError(f"chunk {c}: {len(idx)} memory tokens on re-tokenizing, the bundle says {int(self.count[c])}")
            out.append((key[b][:, idx].transpose(0, 1).float().cpu(), value[b][:, idx].transpose(0, 1).float().cpu()))
        return out

    def chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k_c, v_c (nh, n_c, hs) float32."""
        k, v = self._kv([c])[0]
        return k.transpose(0, 1), v.transpose(0, 1)

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """The distinct retrieved chunks in one pass (sorted by length, so little padding), then padded."""
        uniq = sorted({c for r in ids for c in r}, key=lambda c: (int(self.count[c]), c))
        kv = dict(zip(uniq, self._kv(uniq), strict=True)) if uniq else {}
        owner = {}  # store row -> (chunk, position) for the rows pad_memory asks for
        for c in uniq:
            st = int(self.start[c])
            for i in range(int(self.count[c])):
                owner[st + i] = (c, i)

        def rows(r: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            pick = [owner[int(x)] for x in r]
            return (torch.stack([kv[c][0][i] for c, i in pick]), torch.stack([kv[c][1][i] for c, i in pick]))

        return pad_memory(ids, weights, self.start, self.count, self.num_heads, self.head_dim, device, rows)

    def gather_reference(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """One pass per retrieved chunk, alone (no padding at all)."""
        return pad_memory_reference(ids, weights, self.count, self.num_heads, self.head_dim, device,
                                    lambda c: self._kv([c])[0])




def load_memory(path: Path, manifest: Manifest, load: Callable[[str], np.ndarray], chunk_tokens: np.ndarray,
                texts: list[str]) -> MemoryStore:
    """The bundle's memory store, whatever its representation (`load(name)` memory-maps one .npy):
    the one place a MemoryStore (softknn.model.backends) is chosen, by the manifest's `memory`."""
    kind = memory_kind(manifest.memory)
    start, count = chunk_tokens[:, 0], chunk_tokens[:, 1]
    nh, hs = manifest.model.num_heads, manifest.model.head_dim
    if kind == "kv":
        return KVStore(load("kv_keys.npy"), load("kv_values.npy"), start, count)
    if kind == "recompute":
        return RecomputeStore(texts, start, count, nh, hs)
    hidden = load("mem_hidden.npy")
    if hidden.dtype != HIDDEN_DTYPES[kind] or hidden.ndim != 2 or hidden.shape[1] != nh * hs:
        raise BundleError(f"{Path(path) / 'mem_hidden.npy'}: {hidden.dtype} {hidden.shape}, memory {kind!r} "
                          f"needs {np.dtype(HIDDEN_DTYPES[kind])} (Ntok, {nh * hs})")
    scale = None
    if kind == "hidden-int8":
        scale = np.asarray(load("mem_hidden_scale.npy"), dtype=np.float32)
        if scale.shape != (nh * hs,) or not (scale > 0).all():
            raise BundleError(f"{Path(path) / 'mem_hidden_scale.npy'}: needs ({nh * hs},) positive scales")
    return HiddenStore(hidden, scale, start, count, nh, hs)
