"""The decode graph's attention as a C kernel (attend.c), compiled once per machine with its C compiler and
loaded with ctypes; `attend_reference` is the plain numpy computation it is tested against.

Why: ONNX Runtime's GroupQueryAttention over an int8 cache costs ~2.7 ms a row at k = 8 and does not batch
rows, so at 16 rows a step was three quarters attention (bench/results/attention_kernel.json); the fused
loop reads each row's keys and values once for all the query heads that share them. The shared object is
built with `-O3 -march=native` into the graph cache under a name of the source's hash, the compiler's
version and the CPU's flags, written whole and renamed into place. Without a compiler (or when it fails),
`load` returns None with the reason, and the decode graph keeps GroupQueryAttention."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from functools import lru_cache
from pathlib import Path

import numpy as np

log = logging.getLogger("softknn.generate")

SOURCE = Path(__file__).with_name("attend.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-shared", "-fPIC", "-pthread"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


class Kernel:
    """The loaded kernel: `attend` runs one layer's attention of a step (attend.c's contract)."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.PyDLL(str(path))  # keeps the GIL: a call is short, and one handed back and forth 30
        # times a step would queue the decode thread behind the event loop at each (see SplitBound.run); it
        # also makes the calls one at a time, which the kernel's shared workers need (attend.c)
        f = self.lib.softknn_attend
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 12 + [ctypes.c_float]
        self._f = f
        # the same library again, whose calls release the GIL: layout runs on request threads beside the decode
        # thread, and keeps no state between calls
        free = ctypes.CDLL(str(path))
        g = free.softknn_attend  # the same function with the GIL released: a lane's call (SplitBound), one thread
        g.restype, g.argtypes = f.restype, f.argtypes
        self._f_free = g
        lay = free.softknn_layout
        lay.restype = None
        lay.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p] * 4
        self._layout = lay
        f16 = free.softknn_layout_f16
        f16.restype = None
        f16.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p] * 4
        self._layout_f16 = f16
        lq = free.softknn_layout_q
        lq.restype = None
        lq.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 6
        self._layout_q = lq
        self.lib.softknn_shared_calls.restype = ctypes.c_long

    def layout(self, kv: np.ndarray, scales: np.ndarray, keys: np.ndarray, values: np.ndarray, o: int) -> None:
        """One chunk's kv (n, L, 2, KV, D) float32 quantised with scales (L, 2, KV, D) into keys/values (L, KV, M,
        D) int8 at columns o … o + n − 1, as batch.KVCache.layout's numpy reference does (x / scale, ties to
        even, ±127), in one pass instead of four over the chunk."""
        n, L, two, KV, D = kv.shape
        _check_layout(("kv", kv, np.float32), scales, keys, values, n, L, two, KV, D, o)
        self._layout(n, L, KV, D, keys.shape[2], o, kv.ctypes.data, scales.ctypes.data, keys.ctypes.data,
                     values.ctypes.data)

    def layout_f16(self, kv: np.ndarray, scales: np.ndarray, keys: np.ndarray, values: np.ndarray, o: int) -> None:
        """`layout` from a float16 store's rows: kv (n, L, 2, KV, D) float16, widened exactly (the same bytes as
        `layout` of kv.astype(float32)) in the same pass."""
        n, L, two, KV, D = kv.shape
        _check_layout(("kv", kv, np.float16), scales, keys, values, n, L, two, KV, D, o)
        self._layout_f16(n, L, KV, D, keys.shape[2], o, kv.ctypes.data, scales.ctypes.data, keys.ctypes.data,
                         values.ctypes.data)

    def layout_q(self, codes: np.ndarray, k_range: np.ndarray, v_range: np.ndarray, bits: int, scales: np.ndarray,
                 keys: np.ndarray, values: np.ndarray, o: int) -> None:
        """`layout` from a q4/q2 store's rows (softknn.generate.memory.encode_chunk): codes (n, L, 2, KV,
        D·bits/8) uint8, k_range (L, KV, D, 2) and v_range (n, L, KV, 2) float16, decoded as decode_chunk
        decodes them (code × step + min in float32, the product rounded first) in the same pass."""
        if bits not in (2, 4):
            raise ValueError("layout: bits must be 2 or 4")
        n, L, two, KV, row = codes.shape
        D = row * 8 // bits
        _check_layout(("codes", codes, np.uint8), scales, keys, values, n, L, two, KV, D, o)
        for name, a, shape in (("k_range", k_range, (L, KV, D, 2)), ("v_range", v_range, (n, L, KV, 2))):
            if a.dtype != np.float16 or not a.flags.c_contiguous or a.shape != shape:
                raise ValueError(f"layout: {name} must be C-contiguous float16 {shape}")
        self._layout_q(n, L, KV, D, keys.shape[2], o, bits, codes.ctypes.data, k_range.ctypes.data,
                       v_range.ctypes.data, scales.ctypes.data, keys.ctypes.data, values.ctypes.data)

    def shared_calls(self) -> int:
        """How many calls so far shared their work with the kernel's worker threads (in this process)."""
        return int(self.lib.softknn_shared_calls())

    def attend(self, q: np.ndarray, knew: np.ndarray, vnew: np.ndarray, K: np.ndarray, V: np.ndarray,
               ks: np.ndarray, vs: np.ndarray, seqlens: np.ndarray, bias: np.ndarray, out: np.ndarray,
               attn: np.ndarray | None = None, attn_w: float = 0.0, tlen: np.ndarray | None = None,
               threads: int = 1) -> None:
        """q (B, T, H·D), knew/vnew (B, T, KV·D), K/V (B, KV, C, D) int8 (written at each row's new columns),
        ks/vs (KV·D,), seqlens (B,) int32 (each row's columns after the step − 1), bias (B, T, S) float32,
        out (B, T, H·D) written; attn (B, S) += attn_w × the last token's probabilities summed over heads;
        tlen (B,) int32: row b's new tokens are its first tlen[b] (the rest padding, neither read nor
        written), T where None; threads: how many threads may share the call (the caller and threads − 1
        workers the kernel starts once for the process; a call too small to be worth it runs on the caller
        alone); the result is the same to the bit for any number.
        The arrays must be C-contiguous of these dtypes (checked: a wrong one would read the wrong memory)."""
        B, T, HD = q.shape
        _, KV, C, D = K.shape
        S = bias.shape[-1]
        for name, a, dt in (("q", q, np.float32), ("knew", knew, np.float32), ("vnew", vnew, np.float32),
                            ("K", K, np.int8), ("V", V, np.int8), ("ks", ks, np.float32), ("vs", vs, np.float32),
                            ("seqlens", seqlens, np.int32), ("bias", bias, np.float32), ("out", out, np.float32)):
            if a.dtype != dt or not a.flags.c_contiguous:
                raise ValueError(f"attention kernel: {name} must be C-contiguous {np.dtype(dt).name}")
        if (knew.shape != (B, T, KV * D) or vnew.shape != knew.shape or V.shape != K.shape or out.shape != q.shape
                or K.shape[0] != B or seqlens.shape != (B,) or bias.shape[:2] != (B, T) or ks.size != KV * D):
            raise ValueError("attention kernel: shapes do not agree")
        if attn is not None and (attn.dtype != np.float32 or attn.shape != (B, S) or not attn.flags.c_contiguous):
            raise ValueError("attention kernel: attn must be C-contiguous float32 (B, S)")
        if tlen is not None and (tlen.dtype != np.int32 or tlen.shape != (B,) or not tlen.flags.c_contiguous):
            raise ValueError("attention kernel: tlen must be C-contiguous int32 (B,)")
        self.attend_raw(B, T, HD // D, KV, C, D, S, q.ctypes.data, knew.ctypes.data, vnew.ctypes.data, K.ctypes.data,
                        V.ctypes.data, ks.ctypes.data, vs.ctypes.data, seqlens.ctypes.data,
                        None if tlen is None else tlen.ctypes.data, bias.ctypes.data, out.ctypes.data,
                        None if attn is None else attn.ctypes.data, attn_w, threads)

    def attend_raw(self, B: int, T: int, H: int, KV: int, C: int, D: int, S: int, *pointers_and_weight,
                   release_gil: bool = False) -> None:
        """`attend` on addresses its caller has checked (SplitBound checks its buffers once, not 30 times a
        step): q, knew, vnew, K, V, ks, vs, seqlens, tlen (or None), bias, out, attn (or None), attn_w, threads.
        `release_gil`: the call gives the GIL up while it runs, for one thread only (threads 1: a call on the
        caller alone touches none of the workers' shared state, so lanes may make such calls at once)."""
        if release_gil:
            if pointers_and_weight[-1] != 1:
                raise ValueError("attention kernel: a call that releases the GIL runs on one thread")
            rc = self._f_free(B, T, H, KV, C, D, S, *pointers_and_weight)
        else:
            rc = self._f(B, T, H, KV, C, D, S, *pointers_and_weight)
        if rc != 0:
            raise ValueError(f"attention kernel: a row does not fit (B {B}, T {T}, S {S}, C {C}) or the shape "
                             f"(heads {H}, kv heads {KV}, head dim {D}) is beyond it")


def _check_layout(src: tuple[str, np.ndarray, type], scales: np.ndarray, keys: np.ndarray, values: np.ndarray,
                  n: int, L: int, two: int, KV: int, D: int, o: int) -> None:
    """The layout functions' arguments: C-contiguous of their dtypes, shapes that agree (a wrong one would
    write out of bounds)."""
    for name, a, dt in (src, ("scales", scales, np.float32), ("keys", keys, np.int8), ("values", values, np.int8)):
        if a.dtype != dt or not a.flags.c_contiguous:
            raise ValueError(f"layout: {name} must be C-contiguous {np.dtype(dt).name}")
    M = keys.shape[2] if keys.ndim == 4 else -1
    if two != 2 or scales.shape != (L, 2, KV, D) or keys.shape != (L, KV, M, D) or values.shape != keys.shape \
            or not 0 <= o <= M - n:
        raise ValueError("layout: shapes do not agree")


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@lru_cache(maxsize=4)
def load(cache_dir: Path, generic: bool = False, source: Path = SOURCE) -> tuple[Kernel | None, str]:
    """The kernel built (once) under cache_dir, or None; and why (the path, or what failed). `generic`: the
    plain C loops even where the CPU has AVX-512 (what other machines run; the tests check both); `source`:
    another attend.c (bench/attention_kernel.py's --against builds an earlier revision beside this one)."""
    cc = compiler()
    if cc is None or shutil.which(cc) is None:
        return None, "no C compiler (cc/gcc, or $CC)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed: {e}"
    flags = FLAGS + (["-DSOFTKNN_GENERIC"] if generic else [])
    key = hashlib.sha256(Path(source).read_bytes() + version.encode() + " ".join(flags).encode()
                         + _cpu_flags().encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"attend-{key}.so"
    if not out.is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
        except OSError:  # a read-only cache: this process's own temporary directory
            tmp = Path(tempfile.mkdtemp(prefix="softknn-kernel-")) / f"attend-{key}.so"
            out = tmp
        try:
            r = subprocess.run([cc, *flags, "-o", str(tmp), str(source), "-lm"], capture_output=True, text=True,
                               timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{cc} failed: {e}"
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            return None, f"{cc} failed: {r.stderr.strip()[-500:]}"
        if tmp != out:
            os.replace(tmp, out)
    try:
        return Kernel(out), str(out)
    except OSError as e:
        return None, f"loading {out} failed: {e}"


def attend_reference(q: np.ndarray, knew: np.ndarray, vnew: np.ndarray, K: np.ndarray, V: np.ndarray,
                     ks: np.ndarray, vs: np.ndarray, seqlens: np.ndarray, bias: np.ndarray,
                     tlen: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What Kernel.attend computes, in float64 numpy, one row and head at a time: (out (B, T, H·D), zero for
    a padding token; the last token's probabilities summed over heads (B, S)). Writes the new columns into
    K, V as the kernel does."""
    def quantize_kv(x: np.ndarray, scale: np.ndarray) -> np.ndarray:  # as GroupQueryAttention: x · (1/s), −128…127
        return np.clip(np.rint(x * (np.float32(1) / scale)), -128, 127).astype(np.int8)

    B, T, HD = q.shape
    _, KV, C, D = K.shape
    H, G, S = HD // D, HD // D // KV, bias.shape[-1]
    out = np.zeros((B, T, HD))
    probs = np.zeros((B, S))
    for b in range(B):
        Tb = T if tlen is None else int(tlen[b])
        past = int(seqlens[b]) + 1 - Tb
        for h in range(KV):
            sl = slice(h * D, (h + 1) * D)
            K[b, h, past : past + Tb] = quantize_kv(knew[b, :Tb, sl], ks[sl])
            V[b, h, past : past + Tb] = quantize_kv(vnew[b, :Tb, sl], vs[sl])
        for t in range(Tb):
            n = past + t + 1
            for hq in range(H):
                h = hq // G
                sl = slice(h * D, (h + 1) * D)
                k = K[b, h, :n].astype(np.float64) * ks[sl]
                v = V[b, h, :n].astype(np.float64) * vs[sl]
                s = k @ q[b, t, hq * D : (hq + 1) * D].astype(np.float64) + bias[b, t, :n]
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, t, hq * D : (hq + 1) * D] = p @ v
                if t == Tb - 1:
                    probs[b, :n] += p
    return out, probs
