"""The generator's memory in a bundle: each chunk's keys/values at the memory layers, as the builder
stored them, or not at all (`recompute`: computed from the chunk's tokens when R is known). Files
under `generator/` (their names: softknn.storage.layout.generator_files), checksummed with the rest of the bundle:

    tokens.npy      (N_tok,) int32     every chunk's generator tokens, concatenated in row order
    offsets.npy     (N+1,) int64       chunk c's tokens are tokens[offsets[c]:offsets[c+1]]
    kv.npy          (N_kv, L, 2, nkv, hs·b/8 | hs)   the stored tokens' keys (after RoPE) and values
    kv_scale.npy    int8: (N_kv, L, 2, nkv) float32, x ≈ q·scale per head vector
    k_range.npy     q4/q2: (N, L, nkv, hs, 2) float16 (step, min) of each key channel over its chunk
    v_range.npy     q4/q2: (N_kv, L, nkv, 2) float16 (step, min) of each value head vector
    kept.npy        with token selection: (N_kv,) int32, each stored token's index in its chunk
    kv_offsets.npy  with token selection: (N+1,) int64, chunk c's stored tokens are rows kv_offsets[c]:[c+1]

Representations (`kind`): fp32, fp16, int8 (symmetric, per head vector), q4 / q2 (KIVI: keys
quantised per channel over the chunk's tokens — a key channel's outliers stay in their channel —
values per token and head, asymmetric, b bits), recompute. Token selection (`keep` < 1, SnapKV's
observation-window vote): a chunk keeps the ⌈keep·n⌉ tokens its own last tokens attend to most
(Generator.chunk_kv's `votes`), in order; a kept token keeps its position (its key is stored after
RoPE), so a pruned chunk is the same chunk with some tokens masked out.

`GeneratorStore.chunks` reads R the LMCache way: a bounded in-RAM LRU of decoded chunks over the
memory-mapped store, and `recompute` for what the store does not hold.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from softknn.common.errors import BundleError
from softknn.storage.layout import BITS, GEN_DIR

_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}
POOL = 5  # SnapKV's pooling of the votes: a kept token keeps its neighbours' chance (kernel width)





# --- token selection --------------------------------------------------------------------------------
def select_tokens(votes: np.ndarray, keep: float) -> np.ndarray:
    """Indices (ascending) of the ⌈keep·n⌉ tokens with the most votes (n,) after max-pooling over POOL
    neighbours (SnapKV); ties to the earlier token."""
    n = int(votes.shape[0])
    m = max(1, math.ceil(keep * n - 1e-9))
    if m >= n:
        return np.arange(n)
    pad = POOL // 2
    v = np.pad(np.asarray(votes, dtype=np.float64), pad, mode="edge")
    pooled = np.lib.stride_tricks.sliding_window_view(v, POOL).max(-1)  # (n,)
    order = np.lexsort((np.arange(n), -pooled))  # most votes first, then position
    return np.sort(order[:m])


# --- codecs ---------------------------------------------------------------------------------------------
def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(…, hs) codes < 2^bits → (…, hs·bits/8) bytes, code j of a byte in bits j·b.. (low first)."""
    per = 8 // bits
    q = q.astype(np.uint8).reshape(*q.shape[:-1], q.shape[-1] // per, per)
    out = np.zeros(q.shape[:-1], dtype=np.uint8)
    for j in range(per):
        out |= q[..., j] << (j * bits)
    return out


def _unpack(b: np.ndarray, bits: int) -> np.ndarray:
    per, mask = 8 // bits, (1 << bits) - 1
    parts = [(b >> (j * bits)) & mask for j in range(per)]
    return np.stack(parts, -1).reshape(*b.shape[:-1], b.shape[-1] * per)


def _affine(x: np.ndarray, axis: int, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """codes, step, min of x quantised to `levels` along `axis` (step and min rounded to float16 first,
    so decoding with the stored float16 values is what was rounded to)."""
    lo = x.min(axis, keepdims=True).astype(np.float16)
    hi = x.max(axis, keepdims=True)
    step = ((hi - lo.astype(np.float32)) / (levels - 1)).astype(np.float16)
    step = np.where(step > 0, step, np.float16(1.0)).astype(np.float16)
    q = np.clip(np.rint((x - lo.astype(np.float32)) / step.astype(np.float32)), 0, levels - 1)
    return q, step, lo


def encode_chunk(kv: np.ndarray, kind: str) -> dict[str, np.ndarray]:
    """One chunk's kv (n, L, 2, nkv, hs) float32 → its stored arrays (per-token rows, and for q4/q2 the
    chunk's key ranges `k_range` (1, L, nkv, hs, 2))."""
    if kind in _DTYPES and kind != "int8":
        return {"kv": kv.astype(_DTYPES[kind])}
    if kind == "int8":
        scale = np.abs(kv).max(-1) / 127.0  # (n, L, 2, nkv)
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        return {"kv": np.clip(np.rint(kv / scale[..., None]), -127, 127).astype(np.int8), "kv_scale": scale}
    bits = BITS[kind]
    levels = 1 << bits
    kq, ks, kl = _affine(kv[:, :, 0], 0, levels)  # keys per channel over the chunk's tokens: (1, L, nkv, hs)
    vq, vs, vl = _affine(kv[:, :, 1], -1, levels)  # values per token and head: (n, L, nkv, 1)
    codes = _pack(np.stack([kq, vq], 2), bits)  # (n, L, 2, nkv, hs·b/8)
    return {"kv": codes, "k_range": np.stack([ks, kl], -1), "v_range": np.concatenate([vs, vl], -1)}


def decode_chunk(kind: str, kv: np.ndarray, kv_scale: np.ndarray | None = None, k_range: np.ndarray | None = None,
                 v_range: np.ndarray | None = None) -> np.ndarray:
    """The stored arrays of one chunk → (n, L, 2, nkv, hs) float32 (the reference of encode_chunk)."""
    if kind in ("fp32", "fp16"):
        return np.asarray(kv, dtype=np.float32)
    if kind == "int8":
        assert kv_scale is not None
        return np.asarray(kv, dtype=np.float32) * np.asarray(kv_scale)[..., None]
    assert k_range is not None and v_range is not None
    q = _unpack(np.asarray(kv), BITS[kind]).astype(np.float32)  # (n, L, 2, nkv, hs)
    kr = np.asarray(k_range, dtype=np.float32)  # (L, nkv, hs, 2)
    vr = np.asarray(v_range, dtype=np.float32)  # (n, L, nkv, 2)
    k = q[:, :, 0] * kr[..., 0] + kr[..., 1]
    v = q[:, :, 1] * vr[..., 0:1] + vr[..., 1:2]
    return np.stack([k, v], 2)


def bytes_per_token(kind: str, layers: int, nkv: int, hs: int, tokens_per_chunk: float, stored: float = 1.0,
                    selected: bool = False) -> float:
    """Stored bytes per chunk token (what the manifest's measured figure is checked against, headers
    aside): `stored` the fraction of tokens stored, `selected` whether kept.npy/kv_offsets.npy exist."""
    if kind == "recompute":
        return 0.0
    per_value = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "q4": 0.5, "q2": 0.25}[kind]
    row = layers * 2 * nkv * hs * per_value
    if kind == "int8":
        row += layers * 2 * nkv * 4
    if kind in BITS:
        row += layers * nkv * 2 * 2  # v_range
    out = stored * row
    if kind in BITS:
        out += layers * nkv * hs * 2 * 2 / tokens_per_chunk  # k_range, once a chunk
    if selected:
        out += stored * 4 + 8 / tokens_per_chunk  # kept.npy, kv_offsets.npy
    return out


@dataclass
class ChunkKV:
    """One chunk's memory as R is placed from: kv (m, L, 2, nkv, hs) float32 of its m stored tokens,
    `kept` (m,) their indices in the chunk (None: all of them, in order), `tokens` the chunk's whole
    length (None: m) — the positions it occupies when placed, kept tokens or not."""

    kv: torch.Tensor
    kept: np.ndarray | None = None
    tokens: int | None = None

    @property
    def extent(self) -> int:
        """Positions the chunk spans: its whole token count (a selected chunk keeps its gaps)."""
        return int(self.kv.shape[0]) if self.tokens is None else self.tokens

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * 4 + (0 if self.kept is None else self.kept.nbytes)


_SERIALS = itertools.count()


class GeneratorStore:
    """Read side: R's K/V as float32 tensors, memory-mapped, behind an LRU of decoded chunks."""

    def __init__(self, path: Path, record: dict, n_chunks: int, *, cache_bytes: int = 256 << 20):
        self.record = record
        self.kind = record["memory"]
        self.layers = list(record["layers"])
        self.prefix_len = len(record.get("prefix") or [])
        self.keep = float(record.get("keep", 1.0))
        d = Path(path) / GEN_DIR
        self.tokens = np.load(d / "tokens.npy", mmap_mode="r")
        self.offsets = np.load(d / "offsets.npy")
        if len(self.offsets) != n_chunks + 1 or int(self.offsets[-1]) != len(self.tokens):
            raise BundleError(f"{d}: {len(self.offsets) - 1} chunks of generator memory, the bundle has {n_chunks}")
        stored = self.kind != "recompute"
        self.kv = np.load(d / "kv.npy", mmap_mode="r") if stored else None
        self.scale = np.load(d / "kv_scale.npy", mmap_mode="r") if self.kind == "int8" else None
        self.k_range = np.load(d / "k_range.npy", mmap_mode="r") if self.kind in BITS else None
        self.v_range = np.load(d / "v_range.npy", mmap_mode="r") if self.kind in BITS else None
        selected = stored and (d / "kept.npy").is_file()
        self.kept = np.load(d / "kept.npy", mmap_mode="r") if selected else None
        self.kv_offsets = np.load(d / "kv_offsets.npy") if selected else self.offsets
        if self.kv is not None and self.kv.shape[0] != int(self.kv_offsets[-1]):
            raise BundleError(f"{d / 'kv.npy'}: {self.kv.shape[0]} token rows, its offsets say {int(self.kv_offsets[-1])}")
        self.cache_bytes = cache_bytes
        self._lru: OrderedDict[int, ChunkKV] = OrderedDict()
        self._lru_bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.serial = next(_SERIALS)  # this store among the process's (a decode loop's laid chunks are keyed by it)

    def token_ids(self, row: int) -> list[int]:
        return self.tokens[self.offsets[row] : self.offsets[row + 1]].tolist()

    def decode(self, row: int) -> ChunkKV:
        """Chunk `row`'s stored K/V decoded (no cache): (m, L, 2, nkv, hs) float32 and its kept tokens."""
        assert self.kv is not None, "a recompute memory stores no K/V"
        a, b = int(self.kv_offsets[row]), int(self.kv_offsets[row + 1])
        x = decode_chunk(self.kind, self.kv[a:b], None if self.scale is None else self.scale[a:b],
                         None if self.k_range is None else self.k_range[row],
                         None if self.v_range is None else self.v_range[a:b])
        kept = None if self.kept is None else np.asarray(self.kept[a:b], dtype=np.int64)
        n = int(self.offsets[row + 1] - self.offsets[row])
        return ChunkKV(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), kept, n)

    def stored(self, row: int) -> dict[str, np.ndarray]:
        """Chunk `row`'s stored arrays as the store holds them (memory-mapped, not decoded): `kv`, and `kv_scale`
        (int8) or `k_range` (L, nkv, hs, 2) and `v_range` (q4/q2), as decode_chunk takes them."""
        assert self.kv is not None, "a recompute memory stores no K/V"
        a, b = int(self.kv_offsets[row]), int(self.kv_offsets[row + 1])
        out = {"kv": self.kv[a:b]}
        if self.scale is not None:
            out["kv_scale"] = self.scale[a:b]
        if self.k_range is not None and self.v_range is not None:
            out["k_range"] = self.k_range[row].reshape(self.k_range.shape[-4:])
            out["v_range"] = self.v_range[a:b]
        return out

    def placed_as(self, row: int) -> tuple[int, int, np.ndarray | None]:
        """Chunk `row`'s stored token count, the positions it spans (ChunkKV.extent) and its kept tokens
        (None: all), without decoding it."""
        a, b = int(self.kv_offsets[row]), int(self.kv_offsets[row + 1])
        n = int(self.offsets[row + 1] - self.offsets[row])
        kept = None if self.kept is None else np.asarray(self.kept[a:b], dtype=np.int64)
        return b - a, n, kept

    def chunk(self, row: int) -> torch.Tensor:
        """Chunk `row`'s stored K/V, (m, L, 2, nkv, hs) float32 (dequantised)."""
        return self.decode(row).kv

    def chunks(self, rows: list[int], recompute: Callable[[list[int]], list[ChunkKV]]) -> list[ChunkKV]:
        """R's chunks: from the LRU, else decoded from the store, else `recompute(rows)` (a recompute
        memory); what was read or recomputed enters the LRU (its least recently used leave past
        cache_bytes)."""
        out: dict[int, ChunkKV] = {}
        with self._lock:
            for r in rows:
                hit = self._lru.get(r)
                if hit is not None:
                    self._lru.move_to_end(r)
                    out[r] = hit
            self.hits += len(out)
        todo = [r for r in dict.fromkeys(rows) if r not in out]
        if todo:
            got = recompute(todo) if self.kv is None else [self.decode(r) for r in todo]
            with self._lock:
                self.misses += len(todo)
                for r, c in zip(todo, got, strict=True):
                    out[r] = c
                    self._remember(r, c)
        return [out[r] for r in rows]

    def clear(self) -> None:
        """Drop the decoded chunks' LRU (the next request decodes from the store again: a cold cache)."""
        with self._lock:
            self._lru.clear()
            self._lru_bytes = 0

    def _remember(self, row: int, c: ChunkKV) -> None:
        if c.nbytes > self.cache_bytes:
            return
        old = self._lru.pop(row, None)
        if old is not None:
            self._lru_bytes -= old.nbytes
        self._lru[row] = c
        self._lru_bytes += c.nbytes
        while self._lru_bytes > self.cache_bytes:
            _, gone = self._lru.popitem(last=False)
            self._lru_bytes -= gone.nbytes

    @property
    def bytes_per_chunk(self) -> float:
        return float(self.record.get("bytes_per_chunk", 0.0))
