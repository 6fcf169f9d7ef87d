"""The decode graph (softknn.generate.graph) opened in ONNX Runtime: one session per weight format
and memory-layer set, built once from the model in memory and kept on disk (`graph_file`) with its
weights as external data, which ONNX Runtime maps instead of copying: the weights are file-backed pages
(shared, droppable), not the process's own memory, and a restart opens the file without rebuilding.

`DecoderSession.run` takes the caller's cache arrays as they are (no copy: each is bound as an
OrtValue over the numpy buffer, which the graph appends the new keys/values to) and returns the
logits and the evidence trace as numpy arrays.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softknn.common.errors import ModelRuntimeError
from softknn.generate.graph import (
    KV_FORMATS,
    WEIGHTS,
    DecoderShape,
    build_decoder,
    decoder_shape,
    input_maxima,
    kv_scales,
)
from softknn.generate.kernel import Kernel


def default_graph_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "softknn" / "graphs"


def graph_file(model, weights: str, memory_layers: list[int], cache_dir: Path | None = None, kv: str = "fp32",
               calibration_ids: list[int] | None = None, split: bool = False, rounding: str = "blocks") -> Path:
    """The decode graph of `model` as a file (model.onnx, its initializers in weights.bin; an int8 cache's
    scales also in kv_scales.npy), written once per (the model's weights and config, the weight format,
    the memory layers, the cache format, the calibration tokens of an int8 cache's scales and of w8a8's
    smoothing, the code that writes it) under
    cache_dir and renamed into place whole; later calls return it. `split`: the graph cut at each layer's
    attention (graph.build_decoder), its segments seg_000.onnx … (each with its .bin) in that directory;
    returns the first. `rounding`: w8a8's activation rounding (graph.ROUNDING; `ops` the reference)."""
    import onnx

    from softknn.generate import graph, quant
    from softknn.model.encoder import weight_fingerprint

    code = hashlib.sha256(Path(graph.__file__).read_bytes() + Path(quant.__file__).read_bytes()).hexdigest()[:12]
    # the config too: two models of the same weights differ in RoPE scaling, windows, ... (the graph bakes them in)
    shape = hashlib.sha256(f"{model.config.to_json_string(use_diff=False)}|{memory_layers}".encode()).hexdigest()[:12]
    name = f"{weight_fingerprint(model)[:16]}-{weights}-{shape}-{code}-kv{kv}" + ("-split" if split else "")
    name += f"-{rounding}" if rounding != "blocks" and weights == "w8a8" else ""
    if kv != "fp32" or weights == "w8a8":
        if not calibration_ids:
            raise ValueError(f"a {kv} kv cache and {weights} weights need calibration tokens")
        name += f"-{hashlib.sha256(str(list(calibration_ids)).encode()).hexdigest()[:8]}"
    out = Path(cache_dir or default_graph_cache()) / name
    sweep_stale(out.parent)
    first = "seg_000.onnx" if split else "model.onnx"
    if (out / "done").is_file():
        return out / first
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: this process's own temporary directory (rebuilt at each start)
        own = tempfile.mkdtemp(prefix="softknn-graph-")
        atexit.register(shutil.rmtree, own, True)  # ~200 MB a graph: not left in /tmp by every start
        out = Path(own) / name
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.mkdir()
        scales = None
        if kv != "fp32":
            scales = kv_scales(model, list(calibration_ids or []))
            np.save(tmp / "kv_scales.npy", scales)
        maxima = input_maxima(model, list(calibration_ids or [])) if weights == "w8a8" else None
        built = build_decoder(model, weights, memory_layers, kv, scales, maxima, split=split, rounding=rounding)
        parts = [(f"seg_{i:03d}", m) for i, m in enumerate(built)] if split else [("model", built)]
        for stem, m in parts:
            onnx.save_model(m, tmp / f"{stem}.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                            location="weights.bin" if stem == "model" else f"{stem}.bin", size_threshold=1024)
        (tmp / "done").write_text("ok")
        try:
            os.replace(tmp, out)
        except OSError:  # another process wrote it first: the same bytes
            if not (out / "done").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / first


STALE_S = 3600.0  # a temporary graph directory older than this belongs to a writer that died


def sweep_stale(cache_dir: Path, max_age_s: float = STALE_S) -> list[str]:
    """Remove the temporary directories (`.NAME.XXXXXXXX.tmp`) that writers killed mid-way left in
    cache_dir, once older than max_age_s (a live writer's is younger: it finishes in seconds); the
    names removed. The finished graphs are not touched."""
    removed: list[str] = []
    try:
        entries = list(cache_dir.iterdir())
    except OSError:
        return removed
    now = time.time()
    for e in entries:
        try:
            if e.name.startswith(".") and e.name.endswith(".tmp") and now - e.stat().st_mtime > max_age_s:
                shutil.rmtree(e, ignore_errors=True)
                removed.append(e.name)
        except OSError:  # another process removed it first
            continue
    return removed


def cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def session_options(threads: int, profile: bool = False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(threads, 0)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_mem_pattern = False  # shapes change every step: no plan to reuse
    so.log_severity_level = 3  # the lenient shape merges of the dynamic dims are expected
    so.enable_profiling = profile  # ONNX Runtime's per-node trace (bench/profile_decode.py)
    return so


@dataclass(frozen=True)
class DecoderKey:
    weights: str
    memory_layers: tuple[int, ...]


class DecoderSession:
    """An ORT session of the decode graph for one (weights, memory layers, KV cache format). `kv_scales`
    (L, 2, nkv, hs): an int8 cache's scales (keys, values), which the caller quantises the memory with;
    None for float32."""

    attention = "graph"  # ONNX Runtime's GroupQueryAttention (SplitDecoderSession: the C kernel)
    ragged = False  # every row of a run has T new tokens (GroupQueryAttention: B = 1 when T > 1)

    def __init__(self, model, weights: str, memory_layers: list[int], *, threads: int = 1, profile: bool = False,
                 cache_dir: Path | None = None, kv: str = "fp32", calibration_ids: list[int] | None = None):
        import onnxruntime as ort

        if weights not in WEIGHTS:
            raise ValueError(f"generator weights must be one of {WEIGHTS}, not {weights!r}")
        if kv not in KV_FORMATS:
            raise ValueError(f"generator kv cache must be one of {KV_FORMATS}, not {kv!r}")
        t0 = time.perf_counter()
        self.shape: DecoderShape = decoder_shape(model.config)
        self.weights, self.kv = weights, kv
        self.memory_layers = sorted(set(memory_layers))
        path = graph_file(model, weights, self.memory_layers, cache_dir, kv, calibration_ids)
        self.kv_scales: np.ndarray | None = np.load(path.parent / "kv_scales.npy") if kv != "fp32" else None
        so = session_options(threads, profile)
        try:
            self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - any ORT failure to open is the runtime's failure
            raise ModelRuntimeError(f"decode graph ({weights}) did not open in ONNX Runtime: {e}") from e
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.has_plain_bias = "bias_plain" in self.input_names
        self.load_s = time.perf_counter() - t0
        self._lock = threading.Lock()  # one run at a time: the caller's cache buffers are shared
        # a prefill's intermediates (scores of T rows over C + T columns) are the largest a run makes: after
        # one, the arena gives back what it grew, so a long prompt does not keep its peak for good
        self.shrink = ort.RunOptions()
        self.shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, input_ids: np.ndarray, position_ids: np.ndarray, seqlens_k: np.ndarray, bias: np.ndarray,
            bias_plain: np.ndarray | None, keys: list[np.ndarray], values: list[np.ndarray],
            lengths: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """input_ids, position_ids (B, T) int64; `lengths` None or T for every row (`ragged` False); seqlens_k (B,) each row's columns after the step − 1;
        bias[_plain] (B, 1, T, S) float32, S = max(seqlens_k) + 1; keys[ℓ], values[ℓ] (B, nkv, C, hs)
        float32 (int8 for an int8 cache), C-contiguous, updated in place. Returns the outputs by name: logits (B, V), attn (B, S)
        where the graph has memory."""
        B, T = input_ids.shape
        if lengths is not None and np.any(np.asarray(lengths) != T):
            raise ValueError("GroupQueryAttention's graph: every row of a run has T new tokens")
        return self.bind(keys, values, B, T).run(input_ids, position_ids, seqlens_k, bias, bias_plain)

    def bind(self, keys: list[np.ndarray], values: list[np.ndarray], B: int, T: int) -> Bound:
        """The cache buffers and preallocated outputs bound once, for steps of B rows of T tokens."""
        return Bound(self, keys, values, B, T)


class Bound:
    """An IOBinding of one session with the KV cache buffers (numpy arrays, not copied) bound as both the
    past and the present of every layer, so the graph appends to them in place, and the logits bound to
    a preallocated array: each `run` rebinds only the step's ids, positions, lengths and masks. Valid
    while the cache arrays and the batch shape stay the same (DecodeLoop keeps one per shape)."""

    def __init__(self, ds: DecoderSession, keys: list[np.ndarray], values: list[np.ndarray], B: int, T: int):
        import onnxruntime as ort

        self.ds, self.B, self.T = ds, B, T
        self.binding = ds.session.io_binding()
        self._keep = []  # the OrtValues over the caller's buffers live as long as the binding
        for li in range(ds.shape.layers):
            for kind, arr in (("key", keys[li]), ("value", values[li])):
                if not arr.flags.c_contiguous:
                    raise ValueError(f"{kind} cache of layer {li}: the cache must be C-contiguous")
                ov = ort.OrtValue.ortvalue_from_numpy(arr)
                self._keep.append(ov)
                self.binding.bind_ortvalue_input(f"past_{kind}_{li}", ov)
                self.binding.bind_ortvalue_output(f"present_{kind}_{li}", ov)
        self.logits = np.empty((B, ds.shape.vocab), dtype=np.float32)
        self.binding.bind_output("logits", "cpu", 0, np.float32, list(self.logits.shape), self.logits.ctypes.data)
        self.has_attn = "attn" in ds.output_names

    def run(self, input_ids: np.ndarray, position_ids: np.ndarray, seqlens_k: np.ndarray, bias: np.ndarray,
            bias_plain: np.ndarray | None) -> dict[str, np.ndarray]:
        """One step; `logits` is this binding's array, overwritten by the next run (copy to keep)."""
        import onnxruntime as ort

        feed = {"input_ids": input_ids, "position_ids": position_ids, "seqlens_k": seqlens_k.astype(np.int32),
                "total_sequence_length": np.array(int(seqlens_k.max()) + 1, dtype=np.int32), "bias": bias}
        if self.ds.has_plain_bias:
            feed["bias_plain"] = bias if bias_plain is None else bias_plain
        small = {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a)) for n, a in feed.items()}
        for name, ov in small.items():
            self.binding.bind_ortvalue_input(name, ov)
        if self.has_attn:  # (B, S): S grows every step, so ORT allocates it anew each run
            self.binding.bind_output("attn", "cpu")
        with self.ds._lock:
            self.ds.session.run_with_iobinding(self.binding, self.ds.shrink if self.T > 1 else None)
        out = {"logits": self.logits}
        if self.has_attn:
            out["attn"] = self.binding.get_outputs()[-1].numpy()
        return out


LANE_ROWS = 2  # a decode step of at least this many rows is cut into lanes (SplitBound)
SWITCH_INTERVAL_S = 0.0002  # sys.setswitchinterval while a SplitDecoderSession serves (its __init__)


class SplitDecoderSession:
    """The decode graph with its attention in the C kernel (softknn.generate.kernel): the graph cut at each
    layer's attention (graph.build_decoder, split) into L + 1 ORT sessions, the kernel between them; an
    int8 cache only. The interface of DecoderSession (run, bind, shape, kv_scales, ...), the same numbers
    within the kernel's float rounding (tests/core/test_decode_kernel.py); a row's result does not depend
    on the rows beside it, as with the whole graph."""

    attention = "kernel"
    ragged = True  # run() takes rows of different token counts (DecodeLoop prefills waiting prompts together)

    def __init__(self, model, weights: str, memory_layers: list[int], kernel: Kernel, *, threads: int = 1,
                 attention_threads: int = 0, cache_dir: Path | None = None, calibration_ids: list[int] | None = None,
                 rounding: str = "blocks", profile: bool = False, lanes: int = 0):
        import onnxruntime as ort

        from softknn.generate.graph import rope_for

        if weights not in WEIGHTS:
            raise ValueError(f"generator weights must be one of {WEIGHTS}, not {weights!r}")
        t0 = time.perf_counter()
        self.shape: DecoderShape = decoder_shape(model.config)
        self.weights, self.kv, self.kernel = weights, "int8", kernel
        # the kernel's threads, apart from the segments': it holds the GIL and its workers sleep between
        # calls, so it may take every core while the segments keep generator.threads (1): with 2 ONNX
        # Runtime threads a segment, which wake beside the request threads and the event loop, a trial of
        # gen_serving's 16 streams gave 34.3 ms a token against 27.1 with 1 (one pair of runs)
        self.attention_threads = attention_threads or cores()
        # a decode step of LANE_ROWS rows or more is cut into `lanes` runs of its rows on their own threads
        # (SplitBound): one row's step cannot be cut, and stays on the decode thread
        self.lanes = max(1, lanes or cores())
        self._lane_pool = (ThreadPoolExecutor(self.lanes - 1, thread_name_prefix="softknn-lane")
                           if self.lanes > 1 else None)
        self.memory_layers = sorted(set(memory_layers))
        first = graph_file(model, weights, self.memory_layers, cache_dir, "int8", calibration_ids, split=True,
                           rounding=rounding)
        self.kv_scales: np.ndarray | None = np.load(first.parent / "kv_scales.npy")
        self.scales = [(np.ascontiguousarray(self.kv_scales[li, 0].reshape(-1)),
                        np.ascontiguousarray(self.kv_scales[li, 1].reshape(-1))) for li in range(self.shape.layers)]
        files = sorted(first.parent.glob("seg_*.onnx"))
        if len(files) != self.shape.layers + 1:
            raise ModelRuntimeError(f"decode graph segments: {len(files)} files in {first.parent}, not "
                                    f"{self.shape.layers + 1}")
        so = session_options(threads, profile)  # profile: ONNX Runtime's per-node trace (bench/step_split.py)
        try:
            self.sessions = [ort.InferenceSession(str(f), so, providers=["CPUExecutionProvider"]) for f in files]
        except Exception as e:  # noqa: BLE001 - any ORT failure to open is the runtime's failure
            raise ModelRuntimeError(f"decode graph segments ({weights}) did not open in ONNX Runtime: {e}") from e
        self.seg_inputs = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self.seg_outputs = [[o.name for o in s.get_outputs()] for s in self.sessions]
        self.rope = {"rope_cos": rope_for(model)[0], "rope_sin": rope_for(model)[1]}
        self.output_names = ["logits"] + (["attn"] if self.memory_layers else [])
        self.input_names = {n for ins in self.seg_inputs for n in ins}
        self.has_plain_bias = len(self.memory_layers) < self.shape.layers
        self.load_s = time.perf_counter() - t0
        self._lock = threading.Lock()
        self.shrink = ort.RunOptions()
        self.shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        # a step gives the GIL up at each of its L + 1 segment runs and takes it back after: with Python's
        # default 5 ms switch interval the decode thread then waited at each for whatever the event loop was
        # doing: one stream's p50 inter-token 13.2 ms at 5 ms, 10.6 ms at 0.2 ms (gen_serving streams, docs/generation.md)
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    def run(self, input_ids: np.ndarray, position_ids: np.ndarray, seqlens_k: np.ndarray, bias: np.ndarray,
            bias_plain: np.ndarray | None, keys: list[np.ndarray], values: list[np.ndarray],
            lengths: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """As DecoderSession.run; `lengths` as SplitBound.run (rows of fewer new tokens than T)."""
        B, T = input_ids.shape
        return self.bind(keys, values, B, T).run(input_ids, position_ids, seqlens_k, bias, bias_plain, lengths)

    def bind(self, keys: list[np.ndarray], values: list[np.ndarray], B: int, T: int) -> SplitBound:
        return SplitBound(self, keys, values, B, T)


class SplitBound:
    """The segments' IOBindings over preallocated buffers for steps of B rows of T tokens: the residual
    stream in two buffers (one segment reads one, writes the other), q, k, v and the attention's output
    in one each, the ids and positions copied in each step; the cache arrays as given (int8, C-contiguous,
    (B, nkv, C, hs)), which the kernel writes the new columns into."""

    def __init__(self, ds: SplitDecoderSession, keys: list[np.ndarray], values: list[np.ndarray], B: int, T: int,
                 buffers: dict[str, np.ndarray] | None = None):
        sh = ds.shape
        self.ds, self.B, self.T = ds, B, T
        for li in range(sh.layers):
            for kind, arr in (("key", keys[li]), ("value", values[li])):
                if arr.dtype != np.int8 or not arr.flags.c_contiguous or arr.shape[:2] != (B, sh.kv_heads) \
                        or arr.shape[3] != sh.head_dim:
                    raise ValueError(f"{kind} cache of layer {li}: C-contiguous int8 (B, nkv, C, hs) expected")
        self.keys, self.values = keys, values
        self.C = keys[0].shape[2]
        self._caches = [(keys[li].ctypes.data, values[li].ctypes.data, ds.scales[li][0].ctypes.data,
                         ds.scales[li][1].ctypes.data) for li in range(sh.layers)]
        f32 = np.float32
        self.buffers: dict[str, np.ndarray] = buffers if buffers is not None else {
            "input_ids": np.zeros((B, T), np.int64), "position_ids": np.zeros((B, T), np.int64),
            "last_index": np.full((B, 1), T - 1, np.int64),
            "x0": np.empty((B, T, sh.hidden), f32), "x1": np.empty((B, T, sh.hidden), f32),
            "q": np.empty((B, T, sh.heads * sh.head_dim), f32), "o": np.empty((B, T, sh.heads * sh.head_dim), f32),
            "k": np.empty((B, T, sh.kv_heads * sh.head_dim), f32), "v": np.empty((B, T, sh.kv_heads * sh.head_dim), f32),
            "logits": np.empty((B, sh.vocab), f32), **ds.rope}
        self.logits = self.buffers["logits"]
        # lanes: a decode step of LANE_ROWS rows or more, cut into runs of consecutive rows, each over its rows'
        # slices of the buffers and the cache (views: the lanes write this bound's arrays); lane 0 runs on the
        # calling thread, the others on the session's lane threads
        self.lanes: list[tuple[int, int, SplitBound]] = []
        n = min(ds.lanes, B) if T == 1 and B >= LANE_ROWS and buffers is None else 1
        if n > 1:
            cuts = [B * i // n for i in range(n + 1)]
            for lo, hi in zip(cuts, cuts[1:]):
                views = {name: (a if name in ds.rope else a[lo:hi]) for name, a in self.buffers.items()}
                self.lanes.append((lo, hi, SplitBound(ds, [k[lo:hi] for k in keys], [v[lo:hi] for v in values],
                                                      hi - lo, T, views)))
        self.bindings = []
        for si, sess in enumerate(ds.sessions):
            binding = sess.io_binding()
            for name in ds.seg_inputs[si]:
                a = self.buffers[self._buffer(name)]
                binding.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
            for name in ds.seg_outputs[si]:
                a = self.buffers[self._buffer(name)]
                binding.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
            self.bindings.append(binding)

    def _layers(self, S: int, seq: np.ndarray, tlen: np.ndarray | None, b_mem: np.ndarray, b_plain: np.ndarray,
                attn: np.ndarray | None, w: float, ro, threads: int, release_gil: bool) -> None:
        """The step's segments and attention over this bound's rows (all of them, or a lane's): seq, tlen,
        b_mem, b_plain and attn are those rows' (C-contiguous: slices of the step's arrays along rows)."""
        ds, B, T, buf, sh = self.ds, self.B, self.T, self.buffers, self.ds.shape
        mem = set(ds.memory_layers)
        # the addresses the kernel reads, checked here once (SplitBound.__init__: the cache and buffers)
        q, k, v, o = (buf[n].ctypes.data for n in ("q", "k", "v", "o"))
        ptl = None if tlen is None else tlen.ctypes.data
        pa = None if attn is None else attn.ctypes.data
        pm, pp, ps = b_mem.ctypes.data, b_plain.ctypes.data, seq.ctypes.data
        for li in range(sh.layers):
            ds.sessions[li].run_with_iobinding(self.bindings[li], ro)
            K, V, ks, vs = self._caches[li]
            on = li in mem
            ds.kernel.attend_raw(B, T, sh.heads, sh.kv_heads, self.C, sh.head_dim, S, q, k, v, K, V, ks, vs, ps, ptl,
                                 pm if on else pp, o, pa if on else None, w, threads, release_gil=release_gil)
        ds.sessions[-1].run_with_iobinding(self.bindings[-1], ro)

    @staticmethod
    def _buffer(name: str) -> str:
        """The buffer a segment's input or output lives in: xres_ℓ alternates between x0 and x1."""
        role, _, li = name.rpartition("_")
        if role == "xres":
            return f"x{int(li) % 2}"
        if role in ("q", "k", "v", "o") and li.isdigit():
            return role
        return name

    def run(self, input_ids: np.ndarray, position_ids: np.ndarray, seqlens_k: np.ndarray, bias: np.ndarray,
            bias_plain: np.ndarray | None, lengths: np.ndarray | None = None, laned: bool = True) -> dict[str, np.ndarray]:
        """One step (DecoderSession's Bound.run): `logits` is this binding's array, overwritten by the next run.
        `lengths` (B,): row b's new tokens are its first lengths[b] (the rest padding: not attended, not
        written into the cache, and the logits are of its token lengths[b] − 1); T each where None.
        `laned`: in this bound's lanes where it has them (else on the calling thread alone: the same numbers)."""
        ds, B, T, buf = self.ds, self.B, self.T, self.buffers
        np.copyto(buf["input_ids"], input_ids)
        np.copyto(buf["position_ids"], position_ids)
        tlen = None if lengths is None else np.ascontiguousarray(lengths, dtype=np.int32)
        buf["last_index"][:, 0] = T - 1 if tlen is None else tlen - 1
        seq = np.ascontiguousarray(seqlens_k, dtype=np.int32)
        S = int(seq.max()) + 1
        if bias.shape != (B, 1, T, S) or (bias_plain is not None and bias_plain.shape != bias.shape):
            raise ValueError(f"bias must be (B, 1, T, S) = {(B, 1, T, S)}, not {bias.shape}")
        if seq.shape != (B,) or (tlen is not None and (tlen.shape != (B,) or tlen.min() < 1 or tlen.max() > T)):
            raise ValueError(f"seqlens_k and lengths must be (B,) = ({B},), lengths within 1…{T}")
        mem = set(ds.memory_layers)
        b_mem = np.ascontiguousarray(bias, dtype=np.float32).reshape(B, T, S)
        b_plain = b_mem if bias_plain is None else np.ascontiguousarray(bias_plain, dtype=np.float32).reshape(B, T, S)
        attn = np.zeros((B, S), np.float32) if mem else None
        w = 1.0 / (ds.shape.heads * max(len(mem), 1))
        ro = ds.shrink if T > 1 else None
        with ds._lock:
            if not self.lanes or not laned:
                self._layers(S, seq, tlen, b_mem, b_plain, attn, w, ro, ds.attention_threads, False)
            else:  # each lane its rows' slices; the kernel on one thread a lane, the GIL released in it
                def lane(lo: int, hi: int, bound: SplitBound) -> None:
                    bound._layers(S, seq[lo:hi], None if tlen is None else tlen[lo:hi], b_mem[lo:hi], b_plain[lo:hi],
                                  None if attn is None else attn[lo:hi], w, ro, 1, True)

                assert ds._lane_pool is not None
                others = [ds._lane_pool.submit(lane, *x) for x in self.lanes[1:]]
                try:
                    lane(*self.lanes[0])
                finally:  # every lane done before the buffers are read or bound again
                    for f in others:
                        f.exception()
                for f in others:
                    f.result()
        out = {"logits": self.logits}
        if attn is not None:
            out["attn"] = attn
        return out
