"""The generator's memory in a bundle: each chunk's keys/values at the memory layers, as the builder
stored them (fp32, fp16, int8) or not at all (`recompute`: computed from the chunk's tokens when R is
known). Files under `generator/`, checksummed with the rest of the bundle:

    tokens.npy    (N_tok,) int32     every chunk's generator tokens, concatenated in row order
    offsets.npy   (N+1,) int64       chunk c's tokens are tokens[offsets[c]:offsets[c+1]]
    kv.npy        (N_tok, L, 2, nkv, hs) float32 | float16 | int8   keys (after RoPE) and values
    kv_scale.npy  (N_tok, L, 2, nkv) float32   int8 only: x ≈ q·scale, per token, layer, K/V and head
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from softknn.errors import BundleError

GEN_DIR = "generator"
GEN_MEMORY_KINDS = ("fp32", "fp16", "int8", "recompute")
_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


def generator_files(kind: str | None) -> tuple[str, ...]:
    """The files a bundle's generator memory of `kind` holds (none without a generator)."""
    if kind is None:
        return ()
    if kind not in GEN_MEMORY_KINDS:
        raise ValueError(f"generator memory must be one of {GEN_MEMORY_KINDS}, not {kind!r}")
    files = [f"{GEN_DIR}/tokens.npy", f"{GEN_DIR}/offsets.npy"]
    if kind != "recompute":
        files.append(f"{GEN_DIR}/kv.npy")
    if kind == "int8":
        files.append(f"{GEN_DIR}/kv_scale.npy")
    return tuple(files)


def quantize(kv: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """kv (n, L, 2, nkv, hs) float32 → the stored array (and int8 scales: symmetric, per head vector)."""
    if kind == "int8":
        scale = np.abs(kv).max(-1) / 127.0  # (n, L, 2, nkv)
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        return np.clip(np.rint(kv / scale[..., None]), -127, 127).astype(np.int8), scale
    return kv.astype(_DTYPES[kind]), None


class GeneratorStore:
    """Read side: R's K/V as float32 tensors, (n_c, L, 2, nkv, hs) each, memory-mapped."""

    def __init__(self, path: Path, record: dict, n_chunks: int):
        self.record = record
        self.kind = record["memory"]
        self.layers = list(record["layers"])
        self.prefix_len = len(record.get("prefix") or [])
        d = Path(path) / GEN_DIR
        self.tokens = np.load(d / "tokens.npy", mmap_mode="r")
        self.offsets = np.load(d / "offsets.npy")
        if len(self.offsets) != n_chunks + 1 or int(self.offsets[-1]) != len(self.tokens):
            raise BundleError(f"{d}: {len(self.offsets) - 1} chunks of generator memory, the bundle has {n_chunks}")
        self.kv = np.load(d / "kv.npy", mmap_mode="r") if self.kind != "recompute" else None
        self.scale = np.load(d / "kv_scale.npy", mmap_mode="r") if self.kind == "int8" else None
        if self.kv is not None and self.kv.shape[0] != len(self.tokens):
            raise BundleError(f"{d / 'kv.npy'}: {self.kv.shape[0]} tokens, tokens.npy {len(self.tokens)}")

    def token_ids(self, row: int) -> list[int]:
        return self.tokens[self.offsets[row] : self.offsets[row + 1]].tolist()

    def chunk(self, row: int) -> torch.Tensor:
        """Chunk `row`'s stored K/V, (n, L, 2, nkv, hs) float32 (dequantised)."""
        assert self.kv is not None, "a recompute memory stores no K/V"
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        x = np.asarray(self.kv[a:b], dtype=np.float32)
        if self.scale is not None:
            x = x * np.asarray(self.scale[a:b])[..., None]
        return torch.from_numpy(x)

    @property
    def bytes_per_chunk(self) -> float:
        return float(self.record.get("bytes_per_chunk", 0.0))
