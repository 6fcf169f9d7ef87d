"""Block-quantised weights for ONNX Runtime's MatMulNBits: 4-bit codes in blocks of 32 along the
input dimension, with a float scale and a float minimum per block (the GGUF Q4_1 layout).

    w[n, 32b + i] ≈ d[n, b] · q[n, b, i] + m[n, b],   q ∈ {0 … 15}

MatMulNBits dequantises `(q − zero_point) · scale` with an integer zero point; a GGUF Q4_1 block's
minimum is not on that grid, so the minimum is kept as a float and added separately:

    x · w[n]ᵀ = Σ_b d[n, b] Σ_i q[n, b, i] x[32b + i]  +  Σ_b m[n, b] · (Σ_i x[32b + i])
              = MatMulNBits(x; q, d, zero point 0)      +  blocksum(x) @ mᵀ

which reproduces a Q4_1 model's own weights (each block holds its minimum at code 0 and its
maximum at code 15), so `q4` runs the GGUF file's numbers, not a second rounding of them. A
Q8_0 block (d · q8, q8 ∈ [−127, 127], the tied embedding / output head of such files) is written
as two 4-bit planes, q8 + 128 = 16·hi + lo: w = 16d·hi + d·lo − 128d, again exact.

`dequantize_*` are the plain references the tests compare the packed forms with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32


@dataclass(frozen=True)
class Packed4:
    """One weight (N, K) as MatMulNBits inputs: codes (N, K/32, 16) uint8 (two codes a byte, the
    low nibble first), scales (N, K/32) float32, and the float minimum term mins (N, K/32)."""

    codes: np.ndarray
    scales: np.ndarray
    mins: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        n, nb, _ = self.codes.shape
        return n, nb * BLOCK


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(N, nb, 32) codes 0..15 → (N, nb, 16) bytes, element 2j in the low nibble of byte j."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _blocks(w: np.ndarray) -> np.ndarray:
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"a weight's input dimension must be a multiple of {BLOCK}, not {k}")
    return np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)


def pack_q4(w: np.ndarray) -> Packed4:
    """Affine 4-bit blocks of w (N, K): d = (max − min)/15, m = min, q = round((w − m)/d)."""
    b = _blocks(w)
    lo, hi = b.min(-1), b.max(-1)  # (N, nb)
    d = (hi - lo) / 15.0
    d = np.where(d > 0, d, 1.0).astype(np.float32)  # a constant block: every code 0, w = m
    q = np.clip(np.rint((b - lo[..., None]) / d[..., None]), 0, 15).astype(np.uint8)
    return Packed4(_pack_nibbles(q), d, lo.astype(np.float32))


def pack_q8_as_two_q4(w: np.ndarray) -> tuple[Packed4, Packed4]:
    """Symmetric 8-bit blocks of w (d = max|w|/127, q8 = round(w/d)) as two 4-bit planes whose
    sum is d·q8: hi with scale 16d and the −128d minimum, lo with scale d."""
    b = _blocks(w)
    d = np.abs(b).max(-1) / 127.0
    d = np.where(d > 0, d, 1.0).astype(np.float32)
    u = (np.clip(np.rint(b / d[..., None]), -127, 127) + 128).astype(np.uint8)  # 1..255
    hi, lo = u >> 4, u & 15
    return (Packed4(_pack_nibbles(hi), (16 * d).astype(np.float32), (-128 * d).astype(np.float32)),
            Packed4(_pack_nibbles(lo), d, np.zeros_like(d)))


W8_MAX = 127


def pack_w8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output channel of w (N, K): sw = max|w[n]| / 127, Wq = round(w / sw) in
    [−127, 127]; returns Wq (N, K) int8 and sw (N,) float32 (the decode graph's `w8a8`). Where the CPU
    has no VNNI (AVX-VNNI or AVX512-VNNI), ONNX Runtime multiplies uint8 × int8 pairs into a saturating
    int16 (VPMADDUBSW), which two codes near 255 against two weights near ±127 can reach: there a
    product may be clipped (ONNX Runtime documents it as rarely mattering); with VNNI it is exact."""
    a = np.asarray(w, dtype=np.float32)
    sw = np.abs(a).max(-1) / np.float32(W8_MAX)
    sw = np.where(sw > 0, sw, 1.0).astype(np.float32)
    return np.clip(np.rint(a / sw[:, None]), -W8_MAX, W8_MAX).astype(np.int8), sw


def smoothing(x_max: np.ndarray, w: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """SmoothQuant's per-input-channel factors (K,) for a linear of weight w (N, K) whose inputs reach
    |x_c| ≤ x_max[c]: s_c = x_max_c^α / max_n|w[n, c]|^(1−α). Dividing the inputs by s (folded into the
    op that makes them) and multiplying w's columns by s computes the same product, with the inputs'
    outlier channels moved into the weights, where a per-channel scale absorbs them."""
    w_max = np.abs(np.asarray(w, dtype=np.float32)).max(0)
    s = np.power(np.maximum(x_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
    return np.clip(s, 1e-3, 1e3).astype(np.float32)


def dequantize_w8(wq: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """The (N, K) float32 weight `w8a8` multiplies by (the reference)."""
    return wq.astype(np.float32) * sw[:, None]


def w8a8_matmul(x: np.ndarray, wq: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """The plain reference of the decode graph's `w8a8` linear, x (M, K) float32 @ dequantize_w8(wq, sw)ᵀ
    as the graph computes it: each row's x rounded to int8 with sx = max|x| · (1/127), the integer
    product, then · (sx · sw)."""
    x = np.asarray(x, dtype=np.float32)
    sx = np.maximum(np.abs(x).max(-1, keepdims=True) * np.float32(1 / 127), np.float32(1e-30))
    xq = np.rint(x / sx).astype(np.int64)
    return (xq @ wq.T.astype(np.int64)).astype(np.float32) * (sx * sw)


def dequantize_q4(p: Packed4) -> np.ndarray:
    """The (N, K) float32 weight the packed form multiplies by (the reference)."""
    n, nb, _ = p.codes.shape
    q = np.empty((n, nb, BLOCK), dtype=np.float32)
    q[..., 0::2] = p.codes & 15
    q[..., 1::2] = p.codes >> 4
    return (q * p.scales[..., None] + p.mins[..., None]).reshape(n, nb * BLOCK)


def quantization_error(w: np.ndarray, parts: list[Packed4]) -> float:
    """max |w − Σ dequantize(parts)| over the weight: ~0 for weights that came from Q4_1 / Q8_0 blocks."""
    total = sum(dequantize_q4(p) for p in parts)
    return float(np.abs(np.asarray(w, dtype=np.float32) - total).max())


def is_lossless(w: np.ndarray, parts: list[Packed4]) -> bool:
    """The packed form holds w's own numbers: every difference within float32 rounding of w's scale."""
    return quantization_error(w, parts) <= 1e-6 * float(np.abs(w).max())
