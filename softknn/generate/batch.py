"""Continuous batching over the decode graph: the retrieved chunks' keys/values in the KV cache, one
joint softmax with the k-NN prior as a float mask, and requests that join and leave the running
batch at every step.

A request's memory (softknn.generate.attention.GenMemory: R's keys after RoPE at their placed positions,
and values) is written once into the first M columns of its row of the cache; its prompt and
generated tokens follow. The mask row of the request holds

    log π_c             on chunk c's M columns          (the k-NN prior; 0 for β = 0: the plain joint softmax)
    0                   on its own tokens so far
    −inf                on every other column (not yet written, or another length's padding)

so each step is the model's own attention over [R's tokens ; own context] — what MemoryHook computes
in joint mixing (softknn.generate.attention), with the chat template's prefix rows facing no memory.

`DecodeLoop` (one per model, weights and memory layers: `decode_loop`) runs one thread. Each round it
prefills up to `prefill_chunk` prompt tokens of the new requests (B = 1, a chunk of one prompt per
graph run), then decodes every running request in one batch (B rows, T = 1), and hands each its Step
as chosen; a request joins the batch once its whole prompt is in its row.
`Generator.generate` with a MemoryHook is the plain reference the tests compare with.
"""

from __future__ import annotations

import collections
import logging
import math
import mmap
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from softknn.common.errors import InvalidInput, ModelRuntimeError
from softknn.generate import kernel
from softknn.generate.attention import GenMemory, Trace, log_prior, placement, prompt_positions, rotate_keys
from softknn.generate.graph import KV_DEFAULT
from softknn.generate.memory import GeneratorStore
from softknn.generate.model import Generation, Generator, Sampling, Step, TextStream, choose_token
from softknn.generate.runtime import DecoderSession, SplitBound, SplitDecoderSession, default_graph_cache
from softknn.storage.layout import BITS

log = logging.getLogger(__name__)
COLUMN_BLOCK = 128  # the cache grows in blocks of this many columns
PREFIXES = 8  # prompt prefixes whose keys/values the loop keeps (DecodeLoop._reuse_prefix)
NEG_INF = float("-inf")
LAID_KINDS = ("fp32", "fp16", "q4", "q2")  # stored memories KVCache.layout_stored lays out from their bytes
LAID_CACHE_BYTES = 256 << 20  # KVCache's LRU of chunks so laid out (int8: ~4× the chunks of the store's float LRU)


@dataclass
class PackedMemory:
    """R's K/V as the cache columns they become, chunk after chunk: kv[c] (n_c, L, 2, nkv, hs) float32, chunk
    c's keys (after RoPE at their placed positions) and values at the memory layers `layers` (in that
    order); `bias` (M,) the prior on each column, `chunk` (M,) each column's chunk; the prompt's layout
    (prefix_len tokens before the KB, the rest from prompt_start)."""

    kv: list[np.ndarray]
    layers: list[int]
    bias: np.ndarray
    chunk: np.ndarray
    lengths: list[int]
    prefix_len: int
    prompt_start: int
    _offset: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def columns(self) -> int:
        return int(self.bias.shape[0])

    @property
    def offset(self) -> np.ndarray:
        """(M,) each column's token index within its chunk (computed once: the trace reads it every step)."""
        if self._offset is None:
            starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
            self._offset = np.arange(self.columns, dtype=np.int64) - starts[self.chunk]
        return self._offset


def _prior(weight: torch.Tensor, lengths: list[int], prior: float) -> tuple[np.ndarray, np.ndarray]:
    """(bias (M,), chunk (M,)): log π_c (softknn.generate.attention.log_prior, as MemoryHook's prior) on each
    of chunk c's columns, computed in float64 and rounded to float32."""
    chunk = np.repeat(np.arange(len(lengths)), lengths)  # (M,)
    if not prior:
        return np.zeros(chunk.shape[0], dtype=np.float32), chunk
    return log_prior(weight, prior).float().numpy()[chunk].astype(np.float32), chunk


def pack_chunks(chunks: list[torch.Tensor], layers: list[int], weight: torch.Tensor, prior: float, positions: str,
                inv_freq: torch.Tensor | None, *, encoded_after: int | list[int] = 0, prefix_len: int = 0,
                extents: list[int] | None = None) -> PackedMemory:
    """R's chunk K/V, each (n_c, n_layers, 2, nkv, hs) as the store gives it, placed as place_memory places
    them (softknn.generate.attention), without its padded copy: a chunk whose keys move is rotated, every
    other one is used as it is (the cache rows copy it once, KVCache.place)."""
    lengths = [int(c.shape[0]) for c in chunks]
    shifts, start = placement(lengths, positions, encoded_after=encoded_after, prefix_len=prefix_len, extents=extents)
    kv = []
    for c, shift in zip(chunks, shifts):
        if shift:
            if inv_freq is None:
                raise ValueError("moving memory keys needs the model's rotary frequencies")
            c = c.clone()
            c[:, :, 0] = rotate_keys(c[:, :, 0], shift, inv_freq)  # (n, L, nkv, hs): the rotation acts on hs
        kv.append(c.numpy())
    bias, chunk = _prior(weight.float(), lengths, prior)
    return PackedMemory(kv, list(layers), bias, chunk, lengths, prefix_len, start)


def pack_stored(lengths: list[int], layers: list[int], weight: torch.Tensor, prior: float, positions: str, *,
                encoded_after: int, prefix_len: int, extents: list[int]) -> PackedMemory:
    """pack_chunks' memory for chunks that stay where they were encoded (placement's shifts all 0), laid out
    straight from the store (KVCache.layout_stored): the same columns, prior and layout, with no float rows."""
    shifts, start = placement(lengths, positions, encoded_after=encoded_after, prefix_len=prefix_len, extents=extents)
    if any(shifts):
        raise ValueError("stored chunks laid out as they are must not move")
    bias, chunk = _prior(weight.float(), lengths, prior)
    return PackedMemory([], list(layers), bias, chunk, list(lengths), prefix_len, start)


def pack_memory(memory: GenMemory, prior: float) -> PackedMemory:
    """The same from a GenMemory (the torch path's padded form): the reference path's memory in the graph."""
    layers = sorted(memory.layers)
    kv = []
    for c, n in enumerate(memory.lengths):
        k = torch.stack([memory.layers[layer].key[:, c, :n] for layer in layers])  # (L, nkv, n, hs)
        v = torch.stack([memory.layers[layer].value[:, c, :n] for layer in layers])
        kv.append(torch.stack([k, v], 2).permute(3, 0, 2, 1, 4).contiguous().numpy())  # (n, L, 2, nkv, hs)
    bias, chunk = _prior(memory.weight, list(memory.lengths), prior)
    return PackedMemory(kv, layers, bias, chunk, list(memory.lengths), memory.prefix_len, memory.prompt_start)


@dataclass
class DecodeJob:
    """One generation for the loop: prompt tokens at their positions, its memory (or none), sampling."""

    prompt_ids: list[int]
    positions: list[int]
    memory: PackedMemory | None
    sampling: Sampling
    keep_logits: bool = False
    cancelled: Callable[[], bool] = lambda: False
    out: queue.Queue = field(default_factory=queue.Queue)  # Step…, then Generation, or an exception
    laid: list[tuple[np.ndarray, np.ndarray]] | None = None  # the memory in the cache's layout, in pieces
    # (KVCache.layout's one, or layout_stored's one a chunk), until its row holds it


@dataclass(eq=False)  # compared by identity: the loop finds a sequence in `running` by itself
class _Seq:
    job: DecodeJob
    slot: int
    length: int  # cache columns in use (memory + tokens fed)
    next_pos: int  # RoPE position of the next token fed
    text: TextStream
    gen: Generation
    rng: torch.Generator | None
    last: int = -1  # the token to feed next
    steps: int = 0
    fed: int = 0  # prompt tokens prefilled so far
    need: int = 0  # cache columns reserved for it: memory, prompt and max_tokens
    column_mass: np.ndarray | None = None  # the trace's token mass summed per memory column (_trace_step)

    @property
    def memory_columns(self) -> int:
        return self.job.memory.columns if self.job.memory is not None else 0


def _anonymous(shape: tuple[int, ...], dtype: type = np.float32) -> tuple[np.ndarray, mmap.mmap]:
    """An array of `shape` over an anonymous mapping (zero pages until written) and the mapping, whose
    pages KVCache.release gives back to the system."""
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: MADV_DONTNEED frees it
    return np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape))).reshape(shape), mm


def quantize_kv(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x / scale rounded to the nearest integer (ties to even) and clipped to ±127, as int8: what ONNX
    Runtime's int8 cache writes for a new key or value (the test compares the two)."""
    return np.clip(np.rint(x / scale), -127, 127).astype(np.int8)


class KVCache:
    """Preallocated cache rows: keys[ℓ], values[ℓ] (B, nkv, C, hs) and the additive mask rows bias (B, C)
    (memory layers) and bias_plain (B, C) (layers without memory). Sequences hold rows 0..n−1; C and B
    grow (copying the rows in use), never shrink while in use. The key/value buffers are anonymous
    mappings: a page is resident once written, and `release` gives a row's pages back when it empties,
    so the cache's resident size is what its live rows have written. With `scales` (L, 2, nkv, hs) the
    buffers are int8 (the decode graph's int8 cache) and `layout` quantises the memory with them."""

    def __init__(self, layers: int, nkv: int, hs: int, scales: np.ndarray | None = None,
                 kern: kernel.Kernel | None = None):
        self.L, self.nkv, self.hs = layers, nkv, hs
        self.scales = None if scales is None else scales[:, :, :, None, :]  # (L, 2, nkv, 1, hs): a row's (nkv, n, hs)
        self._scales_flat = None if scales is None else np.ascontiguousarray(scales, dtype=np.float32)  # (L, 2, nkv, hs)
        self.kernel = kern  # an int8 cache's layout in the C kernel's one pass (layout_reference: numpy)
        self.dtype: type = np.float32 if scales is None else np.int8
        self.B, self.C = 0, 0
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self._maps: list[mmap.mmap] = []
        self.bias = np.zeros((0, 0), dtype=np.float32)
        self.bias_plain = np.zeros((0, 0), dtype=np.float32)
        # stored chunks laid out as this cache's columns (layout_stored), by (store serial, row): the pieces
        # are read-only once made, and shared by every request that retrieves the chunk
        self.laid_cache_bytes = LAID_CACHE_BYTES
        self._laid: collections.OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._laid_bytes = 0
        self._laid_lock = threading.Lock()
        self._scales_by_layers: dict[tuple[int, ...], np.ndarray] = {}
        self.laid_hits = self.laid_misses = 0

    @property
    def column_bytes(self) -> int:
        """Bytes one cache column takes over every layer (keys and values)."""
        return self.L * 2 * self.nkv * self.hs * np.dtype(self.dtype).itemsize

    def ensure(self, rows: int, columns: int, used: int) -> None:
        """Room for `rows` rows of `columns` columns; the first `used` rows are kept."""
        if rows <= self.B and columns <= self.C:
            return
        B = max(rows, self.B)
        C = max(self.C, COLUMN_BLOCK * math.ceil(columns / COLUMN_BLOCK))
        if columns > self.C and self.C:
            C = max(C, 2 * self.C)  # grow geometrically: each growth copies every row in use
        bufs = [_anonymous((B, self.nkv, C, self.hs), self.dtype) for _ in range(2 * self.L)]
        keys, values = [a for a, _ in bufs[: self.L]], [a for a, _ in bufs[self.L :]]
        bias = np.full((B, C), NEG_INF, dtype=np.float32)
        bias_plain = np.full((B, C), NEG_INF, dtype=np.float32)
        if used:
            for li in range(self.L):
                keys[li][:used, :, : self.C] = self.keys[li][:used]
                values[li][:used, :, : self.C] = self.values[li][:used]
            bias[:used, : self.C] = self.bias[:used]
            bias_plain[:used, : self.C] = self.bias_plain[:used]
        self.keys, self.values, self.bias, self.bias_plain, self.B, self.C = keys, values, bias, bias_plain, B, C
        self._maps = [m for _, m in bufs]

    def move(self, src: int, dst: int, columns: int) -> None:
        """Row src's first `columns` columns (and its mask rows) into row dst."""
        for li in range(self.L):
            self.keys[li][dst, :, :columns] = self.keys[li][src, :, :columns]
            self.values[li][dst, :, :columns] = self.values[li][src, :, :columns]
        self.bias[dst] = self.bias[src]
        self.bias_plain[dst] = self.bias_plain[src]

    def release(self, row: int) -> None:
        """Row `row`'s pages given back (they read as zeros until written again)."""
        size = self.nkv * self.C * self.hs * np.dtype(self.dtype).itemsize  # a row's bytes in one buffer: page-aligned (C in blocks of 128)
        if size % mmap.PAGESIZE or not hasattr(mmap, "MADV_DONTNEED"):
            return
        for m in self._maps:
            m.madvise(mmap.MADV_DONTNEED, row * size, size)

    def layout(self, mem: PackedMemory) -> tuple[np.ndarray, np.ndarray]:
        """R's keys and values as a row of this cache holds them: (len(mem.layers), nkv, M, hs) each, in
        mem.layers' order and the cache's dtype (an int8 cache's quantised with its scales, as the kernel
        quantises a new token). DecodeLoop.submit computes it on the caller's thread, so the loop's
        thread, which every running request waits on, only copies it (`place`). With the C kernel an int8
        cache's is its one pass a chunk (GIL released), the same bytes as `layout_reference` (tested);
        ~13 ms a request at k 8 in numpy, 16 requests at once held back the first prefill ~0.2 s."""
        if self.kernel is None or self._scales_flat is None:
            return self.layout_reference(mem)
        shape = (len(mem.layers), self.nkv, mem.columns, self.hs)
        keys: np.ndarray = np.empty(shape, dtype=np.int8)
        values: np.ndarray = np.empty(shape, dtype=np.int8)
        scales = np.ascontiguousarray(self._scales_flat[mem.layers])
        o = 0
        for kv in mem.kv:  # (n, L, 2, nkv, hs)
            self.kernel.layout(np.ascontiguousarray(kv, dtype=np.float32), scales, keys, values, o)
            o += kv.shape[0]
        return keys, values

    def layout_reference(self, mem: PackedMemory) -> tuple[np.ndarray, np.ndarray]:
        """`layout` in numpy, a layer of a chunk at a time."""
        shape = (len(mem.layers), self.nkv, mem.columns, self.hs)
        keys: np.ndarray = np.empty(shape, dtype=self.dtype)
        values: np.ndarray = np.empty(shape, dtype=self.dtype)
        o = 0
        for kv in mem.kv:  # (n, L, 2, nkv, hs)
            n = kv.shape[0]
            for j, li in enumerate(mem.layers):
                k, v = kv[:, j, 0].transpose(1, 0, 2), kv[:, j, 1].transpose(1, 0, 2)  # (nkv, n, hs)
                if self.scales is not None:
                    k, v = quantize_kv(k, self.scales[li, 0]), quantize_kv(v, self.scales[li, 1])
                keys[j, :, o : o + n] = k
                values[j, :, o : o + n] = v
            o += n
        return keys, values

    def place(self, slot: int, mem: PackedMemory | None, laid: list[tuple[np.ndarray, np.ndarray]] | None = None) -> int:
        """Row `slot` reset, R's keys/values written into its first M columns (memory layers) with their
        prior in the mask row; M. `laid`: R's columns in this cache's layout computed beforehand, in pieces
        that follow each other (`layout(mem)`'s one, or `layout_stored`'s one a chunk); else computed here."""
        self.bias[slot], self.bias_plain[slot] = NEG_INF, NEG_INF
        if mem is None:
            return 0
        pieces = laid if laid is not None else [self.layout(mem)]
        M = mem.columns
        o = 0
        for keys, values in pieces:
            n = keys.shape[2]
            for j, li in enumerate(mem.layers):
                self.keys[li][slot, :, o : o + n] = keys[j]
                self.values[li][slot, :, o : o + n] = values[j]
            o += n
        if o != M:
            raise ValueError(f"laid memory of {o} columns for a memory of {M}")
        self.bias[slot, :M] = mem.bias
        return M

    # --- stored chunks laid out straight from the store ------------------------------------------------
    def lays_stored(self, kind: str) -> bool:
        """Whether `layout_stored` takes a store of this kind: an int8 cache with the C kernel, and a memory
        of fp32, fp16, q4 or q2 rows (int8 and recomputed memories go through float rows)."""
        return self.kernel is not None and self._scales_flat is not None and kind in LAID_KINDS

    def layout_stored(self, store: GeneratorStore, rows: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Chunks `rows` of `store` as this cache's columns, a (keys, values) piece a chunk, each (L, nkv, n_c,
        hs) int8 at the store's layers: what `layout` gives for their decoded float rows placed where they
        were encoded (the same bytes: layout_stored_reference, tested), in one pass over the stored bytes
        (no float copy of the chunk: ~3 ms for 8 fp16 chunks against ~25 ms decoded and laid out), kept in
        an LRU of LAID_CACHE_BYTES (a quarter of the float rows' size). Called on the request's thread (the
        kernel releases the GIL). Only where `lays_stored(store.kind)`."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        with self._laid_lock:
            for r in rows:
                hit = self._laid.get((store.serial, r))
                if hit is not None:
                    self._laid.move_to_end((store.serial, r))
                    out[r] = hit
            self.laid_hits += len(out)
        todo = [r for r in dict.fromkeys(rows) if r not in out]
        if todo:
            got = {r: self._lay_stored(store, r) for r in todo}
            with self._laid_lock:
                self.laid_misses += len(todo)
                for r, piece in got.items():
                    out[r] = piece
                    self._remember_laid((store.serial, r), piece)
        return [out[r] for r in rows]

    def _lay_stored(self, store: GeneratorStore, row: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.kernel is not None and self._scales_flat is not None
        arrays = store.stored(row)
        n = int(arrays["kv"].shape[0])
        shape = (len(store.layers), self.nkv, n, self.hs)
        keys: np.ndarray = np.empty(shape, dtype=np.int8)
        values: np.ndarray = np.empty(shape, dtype=np.int8)
        scales = self._stored_scales(tuple(store.layers))
        kv = np.ascontiguousarray(arrays["kv"])
        if store.kind == "fp32":
            self.kernel.layout(kv, scales, keys, values, 0)
        elif store.kind == "fp16":
            self.kernel.layout_f16(kv, scales, keys, values, 0)
        else:
            self.kernel.layout_q(kv, np.ascontiguousarray(arrays["k_range"]), np.ascontiguousarray(arrays["v_range"]),
                                 BITS[store.kind], scales, keys, values, 0)
        return keys, values

    def layout_stored_reference(self, store: GeneratorStore, row: int) -> tuple[np.ndarray, np.ndarray]:
        """`layout_stored` of one chunk the plain way: the store's decode (float32 rows) through layout_reference."""
        kv = store.decode(row).kv.numpy()
        n = int(kv.shape[0])
        mem = PackedMemory([kv], list(store.layers), np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.int64), [n], 0, 0)
        return self.layout_reference(mem)

    def clear_laid(self) -> None:
        """Drop the LRU of laid chunks (the next request lays its chunks out from the store again)."""
        with self._laid_lock:
            self._laid.clear()
            self._laid_bytes = 0

    def _stored_scales(self, layers: tuple[int, ...]) -> np.ndarray:
        got = self._scales_by_layers.get(layers)
        if got is None:
            assert self._scales_flat is not None
            got = self._scales_by_layers[layers] = np.ascontiguousarray(self._scales_flat[list(layers)])
        return got

    def _remember_laid(self, key: tuple[int, int], piece: tuple[np.ndarray, np.ndarray]) -> None:
        size = piece[0].nbytes + piece[1].nbytes
        if size > self.laid_cache_bytes:
            return
        old = self._laid.pop(key, None)
        if old is not None:
            self._laid_bytes -= old[0].nbytes + old[1].nbytes
        self._laid[key] = piece
        self._laid_bytes += size
        while self._laid_bytes > self.laid_cache_bytes:
            _, gone = self._laid.popitem(last=False)
            self._laid_bytes -= gone[0].nbytes + gone[1].nbytes


class DecodeLoop:
    """The generation thread of one GenEngine: requests join through a chunked prefill and leave when done.

    Each round prefills at most `prefill_chunk` prompt tokens (of the request being filled, then of the
    oldest waiting ones, one graph run each) and then runs one decode step of every running request, so
    new prompts never stall the running ones for more than one budget of tokens (as vLLM's chunked
    prefill and llama-server's batches do)."""

    def __init__(self, session: DecoderSession | SplitDecoderSession, eos_ids: set[int], tokenizer, *, max_batch: int = 16,
                 prefill_chunk: int = 256, cache_mb: float = 1024):
        self.session = session
        self.shape = session.shape
        self.eos_ids, self.tokenizer = eos_ids, tokenizer
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.mem_layers = set(session.memory_layers)
        self.cache = KVCache(self.shape.layers, self.shape.kv_heads, self.shape.head_dim, session.kv_scales,
                             getattr(session, "kernel", None))
        # the cache's budget, in columns: a request is admitted when the columns it may fill (memory,
        # prompt, max_tokens) fit beside those reserved by the running ones, else it waits its turn
        self.cache_mb = cache_mb
        self.budget = int(cache_mb * 2**20 // self.cache.column_bytes)
        self.reserved = 0
        self.running: list[_Seq] = []
        self.filling: _Seq | None = None  # the request being prefilled: its row is len(running)
        self._waiting: collections.deque[DecodeJob] = collections.deque()
        self._inbox: queue.Queue[DecodeJob | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._hold = threading.Lock()  # taken by the loop around each round (paused())
        # decode steps' bindings by batch size, over the cache arrays of id _bounds_of: a batch that grows and
        # shrinks as requests come and go binds each size once (a 16-row bind with lanes ~3.7 ms, ~1.1 without)
        self._bounds: dict[int, Any] = {}
        self._bounds_of: int | None = None
        self._closing = False
        # keys/values (L, nkv, P, hs) of prompt prefixes that face no memory, by their tokens (vLLM's prefix
        # caching, for the chat template's head that every request with memory starts with)
        self._prefixes: collections.OrderedDict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self.prefix_hits = 0
        self.max_prefilled_together = 0  # the most prompts one run of _prefill_together held
        self.prefill_runs = 0  # graph runs of prompt tokens (_prefill_together's and _prefill_chunk's)
        self.steps = 0  # batched decode steps run (tests, metrics)
        self._held: list[tuple[DecodeJob, object]] | None = None  # a step's results until its rows are done (_put)
        self.max_running = 0
        # work beside the loop that takes a core (a request's retrieval and its memory's layout, a generation in
        # torch): while any runs, a decode step runs on the decode thread alone, not in lanes (SplitBound), which
        # need every core: in the load test's mix, whose fixed-α and exact generations kept both cores busy in
        # torch, lanes at every step gave each of 16 users 29.6 tokens/s against 49.2 without them
        # (docs/generation.md, "Lanes")
        self._occupied = 0
        self._occupied_lock = threading.Lock()

    # --- the caller's side --------------------------------------------------------------------
    def submit(self, job: DecodeJob) -> Iterator[Step | Generation]:
        """Queue the job now; the iterator yields its Steps as the loop chooses them, then its
        Generation. Closing the iterator early cancels the job at its next step."""
        self._check(job)
        if job.memory is not None and self.cache.scales is not None and job.laid is None:
            # quantised here, on the caller's thread (~17 ms for 8 chunks, which the loop's thread would
            # otherwise spend while every running request waits); the job then holds the int8 copy only
            # (~10 MB for 8 chunks, a quarter of the float rows, which the caller may now let go)
            with self.occupied():
                job.laid = [self.cache.layout(job.memory)]
            job.memory = replace(job.memory, kv=[])
        cancel = threading.Event()
        outer = job.cancelled
        job.cancelled = lambda: cancel.is_set() or outer()
        self._inbox.put(job)
        self._ensure_thread()
        return self._results(job, cancel)

    @staticmethod
    def _results(job: DecodeJob, cancel: threading.Event) -> Iterator[Step | Generation]:
        try:
            while True:
                item = job.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Generation):
                    return
        finally:
            cancel.set()

    @contextmanager
    def occupied(self):
        """Around work on another thread that takes a core (a request's retrieval and layout, a generation in
        torch): the loop's steps keep off the lanes meanwhile."""
        with self._occupied_lock:
            self._occupied += 1
        try:
            yield self
        finally:
            with self._occupied_lock:
                self._occupied -= 1

    @contextmanager
    def paused(self):
        """Hold the loop between rounds (jobs submitted meanwhile join together when it resumes)."""
        with self._hold:
            yield self

    def _check(self, job: DecodeJob) -> None:
        if not job.prompt_ids:
            raise InvalidInput("the prompt has no tokens", field="prompt")
        last = max(job.positions) + job.sampling.max_tokens
        if last >= self.shape.max_positions:
            raise InvalidInput(f"prompt and max_tokens reach position {last}; the generator has "
                               f"{self.shape.max_positions}", field="max_tokens")
        if job.memory is not None and set(job.memory.layers) != self.mem_layers:
            raise ValueError(f"memory at layers {sorted(job.memory.layers)}, the decode graph at {sorted(self.mem_layers)}")
        need = _need(job)
        if need > self.budget:
            mb = need * self.cache.column_bytes / 2**20
            raise InvalidInput(f"the KB's tokens, the prompt and max_tokens take {need} cache columns ({mb:.0f} MB); "
                               f"the generator's cache holds {self.budget} ({self.cache_mb:g} MB, "
                               "SOFTKNN_GENERATOR__CACHE_MB): ask for fewer chunks (k) or max_tokens", field="max_tokens")

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="softknn-decode", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._inbox.put(None)

    # --- the loop -----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.running or self.filling is not None or self._waiting)

    def _collect(self, block: bool = True) -> None:
        """Move what the inbox holds into the waiting line (blocking, where `block`, while there is nothing
        to do)."""
        while True:
            try:
                job = self._inbox.get(block=block and not self.busy)
            except queue.Empty:
                return
            if job is None:
                self._closing = True
                return
            self._waiting.append(job)

    def _loop(self) -> None:
        while True:
            self._collect()
            with self._hold:
                # what was submitted while paused() held the round joins it: the first job of several woke
                # this thread alone (a submit's layout gives up the GIL), the others came after
                self._collect(block=False)
                if self._closing:  # close(): what runs or waits ends as cancelled
                    self._close_all()
                    return
                try:
                    self._round()
                except Exception as e:  # noqa: BLE001 - a bug in a step fails the requests in flight, not the loop
                    log.exception("decode loop round failed; failing %d generation(s)", len(self.running))
                    self._fail_all(e)

    def _close_all(self) -> None:
        for seq in list(self.running):
            self._finish(seq, "cancelled")
        if self.filling is not None:
            self._finish(self.filling, "cancelled")
        while self._waiting:
            job = self._waiting.popleft()
            job.out.put(Generation(prompt_tokens=len(job.prompt_ids), finish_reason="cancelled"))

    def _fail_all(self, e: Exception) -> None:
        """Every request in flight fails with e; the loop is empty before the first of them hears it."""
        failed = self.running + ([self.filling] if self.filling is not None else [])
        for row in range(len(failed)):
            self.cache.release(row)
        self.running, self.filling, self.reserved = [], None, 0
        self._bounds.clear()
        for seq in failed:
            seq.job.out.put(e)

    def _round(self) -> None:
        """Up to `prefill_chunk` prompt tokens prefilled (the request being filled, then the oldest waiting
        ones while rows are free: with a session that takes rows of different lengths, the waiting prompts
        that fit whole in what is left, in one run, `_prefill_together`), then one decode step of the
        running requests. The request being filled finishes first, so that the prompts behind it still go
        together; a short prompt the run left out waits for the next round's run rather than begin alone in
        what is left of this one (before, after a run of 9 prompts the 6 left went one run each, ~30 ms
        apiece, a whole pass over the weights for ~25 tokens)."""
        budget = self.prefill_chunk
        together = getattr(self.session, "ragged", False)
        if self.filling is not None:
            budget -= self._prefill_chunk(self.filling, budget)
        if self.filling is None and budget > 0 and together:
            budget -= self._prefill_together(budget)
        while budget > 0:
            if self.filling is None:
                if len(self.running) >= self.max_batch:
                    break
                if together and self._waiting and self._rest(self._waiting[0]) <= self.prefill_chunk:
                    break  # a prompt that fits a round whole waits for the next one's run with the others
                self._start_next()
                if self.filling is None:
                    break
            budget -= self._prefill_chunk(self.filling, budget)
        if self.running:
            self._step()

    def _prefill_together(self, budget: int) -> int:
        """The oldest waiting requests whose prompts (what the loop's kept prefix leaves of them) fit whole in
        `budget` tokens and the free rows, admitted into rows len(running)… and prefilled in one run of rows
        padded to the longest (the padding neither attended nor written: SplitBound.run's lengths); they join
        the running batch with their first token. One run reads the weights once for all of them, where a
        prefill each read them once each (~10 ms a run at 135M parameters). Returns the tokens taken."""
        seqs: list[_Seq] = []
        left = budget
        while self._waiting and len(self.running) + len(seqs) < self.max_batch:
            job = self._waiting[0]
            if self.reserved + _need(job) > self.budget and (self.running or seqs):
                break  # the oldest waits for cache room (no overtaking: it would starve)
            rest = self._rest(job)
            if rest > left:
                break  # a long prompt: prefilled in chunks between steps (the loop after this)
            self._waiting.popleft()
            if job.cancelled():
                job.out.put(Generation(prompt_tokens=len(job.prompt_ids), finish_reason="cancelled"))
                continue
            try:
                seq = self._admit(job, len(self.running) + len(seqs))
            except Exception as e:  # noqa: BLE001 - the failure goes back to its request only
                job.out.put(e)
                continue
            seqs.append(seq)
            left -= len(job.prompt_ids) - seq.fed
        if not seqs:
            return 0
        c, n = self.cache, len(self.running)
        lengths = np.array([len(s.job.prompt_ids) - s.fed for s in seqs])
        B, T = len(seqs), int(lengths.max())
        S = max(s.length + int(t) for s, t in zip(seqs, lengths, strict=True))
        ids, pos = np.zeros((B, T), dtype=np.int64), np.zeros((B, T), dtype=np.int64)
        bias = np.zeros((B, 1, T, S), dtype=np.float32)
        for b, s in enumerate(seqs):  # as _prefill_chunk's bias, row by row
            job, a, t = s.job, s.fed, int(lengths[b])
            ids[b, :t], pos[b, :t] = job.prompt_ids[a:], job.positions[a:]
            pos[b, t:] = job.positions[-1]  # padding: any position the tables hold
            M = s.memory_columns
            bias[b, 0, :, :M] = c.bias[s.slot, :M]
            P = job.memory.prefix_len if job.memory is not None else 0
            bias[b, 0, : max(P - a, 0), :M] = NEG_INF
        plain = bias.copy()
        for b, s in enumerate(seqs):
            plain[b, 0, :, : s.memory_columns] = NEG_INF
        cols = np.array([s.length + int(t) - 1 for s, t in zip(seqs, lengths, strict=True)])
        self.prefill_runs += 1
        try:
            out = self.session.run(ids, pos, cols, bias, plain, [k[n : n + B] for k in c.keys],
                                   [v[n : n + B] for v in c.values], lengths=lengths)
        except Exception as e:  # noqa: BLE001 - the failure goes back to these requests only
            for s in seqs:
                s.job.out.put(e)
                self.reserved -= s.need
                c.release(s.slot)
            return int(lengths.sum())
        attn = out.get("attn")
        for b, s in enumerate(seqs):
            t = int(lengths[b])
            c.bias[s.slot, s.length : s.length + t] = 0.0
            c.bias_plain[s.slot, s.length : s.length + t] = 0.0
            s.length, s.fed = s.length + t, s.fed + t
            self._remember_prefix(s)
            self.running.append(s)  # its row is len(running) already
        self.max_running = max(self.max_running, len(self.running))
        self.max_prefilled_together = max(self.max_prefilled_together, len(seqs))
        for b, s in enumerate(seqs):
            self._emit(s, out["logits"][b], None if attn is None else attn[b])
        return int(lengths.sum())

    def _start_next(self) -> None:
        while self._waiting:
            if self.reserved + _need(self._waiting[0]) > self.budget and (self.running or self.filling is not None):
                return  # the oldest waits for cache room (no overtaking: it would starve)
            job = self._waiting.popleft()
            if job.cancelled():
                job.out.put(Generation(prompt_tokens=len(job.prompt_ids), finish_reason="cancelled"))
                continue
            try:
                self.filling = self._admit(job)
            except Exception as e:  # noqa: BLE001 - the failure goes back to its request only
                job.out.put(e)
                continue
            return

    def _admit(self, job: DecodeJob, n: int | None = None) -> _Seq:
        """A row for `job` (row n, len(running) by default: rows below it are in use), its memory written into it."""
        mem = job.memory
        M = mem.columns if mem is not None else 0
        need = _need(job)
        n = len(self.running) if n is None else n
        # every row the loop may run, at once: pages never written are never touched (a row costs what it
        # fills), and growing row by row would copy the whole cache at each admission
        self.cache.ensure(self.max_batch, need, n)
        self.cache.place(n, mem, job.laid)
        job.laid = None  # the row holds it now
        rng = torch.Generator().manual_seed(job.sampling.seed) if job.sampling.seed is not None else None
        self.reserved += need
        seq = _Seq(job, n, M, max(job.positions) + 1, TextStream(self.tokenizer, self.eos_ids, job.sampling.stop,
                                                                     ignore_eos=job.sampling.ignore_eos),
                   Generation(prompt_tokens=len(job.prompt_ids), trace=Trace() if mem is not None else None), rng,
                   need=need)
        self._reuse_prefix(seq)
        return seq

    def _rest(self, job: DecodeJob) -> int:
        """The prompt tokens of `job` a prefill runs: what the kept prefix leaves of them."""
        key = self._prefix_of(job)
        return len(job.prompt_ids) - (len(key) if key is not None and key in self._prefixes else 0)

    def _prefix_of(self, job: DecodeJob) -> tuple[int, ...] | None:
        """The tokens of job's prefix that faces no memory (positions 0..P−1), or None: with memory, the
        prefix rows attend to themselves only, so their keys/values are the same whatever R is."""
        P = job.memory.prefix_len if job.memory is not None else 0
        if P == 0 or P >= len(job.prompt_ids) or list(job.positions[:P]) != list(range(P)):
            return None
        return tuple(job.prompt_ids[:P])

    def _reuse_prefix(self, seq: _Seq) -> None:
        """The prefix's keys/values copied into seq's row after its memory, when the loop holds them: its
        prefill starts after the prefix."""
        key = self._prefix_of(seq.job)
        hit = self._prefixes.get(key) if key is not None else None
        if key is None or hit is None:
            return
        self._prefixes.move_to_end(key)
        keys, values = hit  # (L, nkv, P, hs)
        c, s, M, P = self.cache, seq.slot, seq.length, len(key)
        for li in range(c.L):
            c.keys[li][s, :, M : M + P] = keys[li]
            c.values[li][s, :, M : M + P] = values[li]
        c.bias[s, M : M + P] = 0.0
        c.bias_plain[s, M : M + P] = 0.0
        seq.length, seq.fed = M + P, P
        self.prefix_hits += 1

    def _remember_prefix(self, seq: _Seq) -> None:
        """After seq's first chunk covered its prefix: the prefix's keys/values kept for the next requests."""
        key = self._prefix_of(seq.job)
        if key is None or key in self._prefixes or seq.fed < len(key):
            return
        c, s, M, P = self.cache, seq.slot, seq.memory_columns, len(key)
        self._prefixes[key] = (np.stack([c.keys[li][s, :, M : M + P] for li in range(c.L)]),
                               np.stack([c.values[li][s, :, M : M + P] for li in range(c.L)]))
        while len(self._prefixes) > PREFIXES:
            self._prefixes.popitem(last=False)

    def _finish(self, seq: _Seq, reason: str | None = None) -> None:
        if reason is not None:
            seq.gen.finish_reason = reason
        seq.gen.token_ids, seq.gen.text = seq.text.token_ids, seq.text.text
        if seq.gen.trace is not None and seq.column_mass is not None and seq.job.memory is not None:
            _trace_token_mass(seq.gen.trace, seq.column_mass, seq.job.memory)
        self._put(seq.job, seq.gen)
        self._drop(seq)

    def _put(self, job: DecodeJob, item) -> None:
        """item to job's queue, or held until the step's rows have all had their token (_step)."""
        if self._held is None:
            job.out.put(item)
        else:
            self._held.append((job, item))

    def _drop(self, seq: _Seq) -> None:
        """seq leaves its row: the last running row moves into it, and the row being filled follows the
        running ones down, so they stay rows 0..n−1 and it row n; the row left empty gives its pages back."""
        self.reserved -= seq.need
        if seq is self.filling:
            self.filling = None
            self.cache.release(seq.slot)
            return
        i = self.running.index(seq)
        last = self.running[-1]
        if last is not seq:
            self.cache.move(last.slot, seq.slot, last.length)
            last.slot = seq.slot
            self.running[i] = last
        self.running.pop()
        empty = len(self.running)
        f = self.filling
        if f is not None:
            self.cache.move(f.slot, len(self.running), f.length)
            empty, f.slot = f.slot, len(self.running)
        self.cache.release(empty)

    def _emit(self, seq: _Seq, logits: np.ndarray, attn: np.ndarray | None, greedy: int | None = None) -> None:
        """Choose seq's next token from its logits (V,) (`greedy`: their argmax, taken for the whole
        batch at once, which temperature 0 uses); record the trace; finish it when done."""
        job = seq.job
        lt = torch.from_numpy(logits)  # a view of the step's output buffer: copied where it is kept
        if seq.gen.trace is not None and attn is not None and job.memory is not None:
            seq.column_mass = _trace_step(seq.gen.trace, attn[: job.memory.columns], job.memory, seq.column_mass)
        tok = int(greedy) if greedy is not None and job.sampling.temperature <= 0 else choose_token(lt, job.sampling, seq.rng)
        kept = lt.clone() if job.keep_logits else None
        if kept is not None:
            seq.gen.logits.append(kept)
        step = seq.text.add(tok, kept)
        seq.steps += 1
        if step is not None:
            self._put(job, step)
        if seq.text.finished:
            self._finish(seq, "stop")
        elif seq.steps >= job.sampling.max_tokens:
            self._finish(seq, "length")
        else:
            seq.last = tok

    def _prefill_chunk(self, seq: _Seq, limit: int) -> int:
        """The next ≤ limit prompt tokens of seq through the graph (B = 1) into its row; after the last
        one, its first token, and it joins the running batch. Returns the tokens it took from the budget
        (at least 1, so a cancelled or failed request still counts)."""
        job = seq.job
        if job.cancelled():
            self._finish(seq, "cancelled")
            return 1
        c, M = self.cache, seq.memory_columns
        a = seq.fed
        T = min(limit, len(job.prompt_ids) - a)
        S = seq.length + T  # the row's columns after this chunk: memory, the tokens fed, these
        # rows a … a+T−1 of the prompt: the memory's prior (none for the prefix rows), own columns 0
        bias = np.zeros((1, 1, T, S), dtype=np.float32)
        bias[0, 0, :, :M] = c.bias[seq.slot, :M]
        P = job.memory.prefix_len if job.memory is not None else 0
        bias[0, 0, : max(P - a, 0), :M] = NEG_INF
        plain = bias.copy()
        plain[0, 0, :, :M] = NEG_INF
        s = seq.slot
        self.prefill_runs += 1
        try:
            out = self.session.run(np.array([job.prompt_ids[a : a + T]], dtype=np.int64),
                                   np.array([job.positions[a : a + T]], dtype=np.int64), np.array([S - 1]), bias, plain,
                                   [k[s : s + 1] for k in c.keys], [v[s : s + 1] for v in c.values])
        except Exception as e:  # noqa: BLE001 - the failure goes back to its request only
            job.out.put(e)
            self._drop(seq)
            return T
        c.bias[s, seq.length : S] = 0.0
        c.bias_plain[s, seq.length : S] = 0.0
        seq.length, seq.fed = S, a + T
        self._remember_prefix(seq)
        if seq.fed < len(job.prompt_ids):
            return T
        self.filling = None
        self.running.append(seq)  # its row is len(running) already
        self.max_running = max(self.max_running, len(self.running))
        attn = out.get("attn")
        self._emit(seq, out["logits"][0], None if attn is None else attn[0])
        return T

    def _step(self) -> None:
        for seq in [s for s in self.running if s.job.cancelled()]:
            self._finish(seq, "cancelled")
        if not self.running:
            return
        seqs = list(self.running)
        n, c = len(seqs), self.cache
        cols = np.array([s.length for s in seqs])  # each row's new column
        S = int(cols.max()) + 1
        bias = np.zeros((n, 1, 1, S), dtype=np.float32)
        bias[:, 0, 0, :] = c.bias[:n, :S]
        bias[np.arange(n), 0, 0, cols] = 0.0
        plain = np.zeros((n, 1, 1, S), dtype=np.float32)
        plain[:, 0, 0, :] = c.bias_plain[:n, :S]
        plain[np.arange(n), 0, 0, cols] = 0.0
        if self._bounds_of != id(c.keys[0]):  # new cache arrays: the bindings of the old ones go
            self._bounds.clear()
            self._bounds_of = id(c.keys[0])
        bound = self._bounds.get(n)
        if bound is None:
            bound = self._bounds[n] = self.session.bind([k[:n] for k in c.keys], [v[:n] for v in c.values], n, 1)
        ids = np.array([[s.last] for s in seqs], dtype=np.int64)
        pos = np.array([[s.next_pos] for s in seqs], dtype=np.int64)
        try:
            out = (bound.run(ids, pos, cols, bias, plain, laned=self._occupied == 0) if isinstance(bound, SplitBound)
                   else bound.run(ids, pos, cols, bias, plain))
        except Exception as e:  # noqa: BLE001 - a failed step fails the requests in it, not the loop
            for s in seqs:
                s.job.out.put(e)
                self._drop(s)
            return
        self.steps += 1
        rows = np.arange(n)
        c.bias[rows, cols] = 0.0
        c.bias_plain[rows, cols] = 0.0
        for s in seqs:  # every row's new column counted before any row leaves (a move copies `length`)
            s.length += 1
            s.next_pos += 1
        attn = out.get("attn")
        greedy = out["logits"].argmax(axis=1)  # one call for the batch; the first maximum, as torch's argmax
        # the step's tokens go to their requests after the last row's: a put wakes the request's thread,
        # which then asks for the GIL, so 16 puts between the rows' work took the decode thread ~3 ms a
        # 16-row step in the server against ~0.85 ms in-process (docs/generation.md)
        self._held = []
        try:
            for j, s in enumerate(seqs):
                self._emit(s, out["logits"][j], None if attn is None else attn[j], int(greedy[j]))
        finally:
            held, self._held = self._held, None
            for job, item in held:
                job.out.put(item)


ATTENTION = ("auto", "kernel", "graph")


def decoder_session(generator: Generator, weights: str, layers: list[int], *, threads: int = 1, kv: str = KV_DEFAULT,
                    attention: str = "auto", attention_threads: int = 0, lanes: int = 0
                    ) -> DecoderSession | SplitDecoderSession:
    """The decode graph's session: the segments around the C kernel (an int8 cache, `attention` kernel or auto
    where the kernel compiles; `attention_threads` its threads, 0 = cores; `lanes` the threads a step of
    several rows is cut among, 0 = cores), else the whole graph (decode_loop)."""
    calib = generator.calibration_ids()
    if kv == "int8" and attention != "graph":
        kern, why = kernel.load(default_graph_cache())
        if kern is not None:
            return SplitDecoderSession(generator.model, weights, layers, kern, threads=threads,
                                       attention_threads=attention_threads, calibration_ids=calib, lanes=lanes)
        if attention == "kernel":
            raise ModelRuntimeError(f"generator.attention kernel: the attention kernel did not build: {why}")
        log.warning("decode attention: GroupQueryAttention (the C kernel did not build: %s)", why)
    return DecoderSession(generator.model, weights, layers, threads=threads, kv=kv, calibration_ids=calib)


def _need(job: DecodeJob) -> int:
    """Cache columns a job may fill: its memory, its prompt and max_tokens."""
    return (job.memory.columns if job.memory is not None else 0) + len(job.prompt_ids) + job.sampling.max_tokens


def _trace_step_reference(trace: Trace, attn: np.ndarray, mem: PackedMemory) -> None:
    """One token's memory mass from the graph's attention row over the memory columns (M,): per
    chunk the sum of its columns (the joint gate g_c, = its share), per chunk token the column. The
    plain per-chunk loop `_trace_step` is compared with (tests/core/test_decode_graph.py)."""
    S, Lm = len(mem.lengths), max(mem.lengths)
    a = torch.from_numpy(np.asarray(attn, dtype=np.float32))
    mass = torch.zeros(S).index_add_(0, torch.from_numpy(mem.chunk).long(), a)
    tok = torch.zeros(S, Lm)
    o = 0
    for ci, n in enumerate(mem.lengths):
        tok[ci, :n] = a[o : o + n]
        o += n
    trace.mass.append(mass)
    trace.share.append(mass.clone())
    trace.token_mass = tok if trace.token_mass is None else trace.token_mass + tok
    p = mass / mass.sum().clamp(min=1e-30)
    trace.attention_entropy.append(float(torch.special.entr(p).sum()))


def _trace_step(trace: Trace, attn: np.ndarray, mem: PackedMemory, columns: np.ndarray | None) -> np.ndarray:
    """_trace_step_reference in a few numpy calls (the decode thread runs it for every row at every
    step): the chunk sums by bincount; the token mass summed per memory column in `columns` (the row's
    running sum, returned: None at the first step), laid out as (S, Lm) once, when the row ends
    (_trace_token_mass): the same float32 sums in the same order as the reference's per-step adds."""
    S = len(mem.lengths)
    a = np.asarray(attn, dtype=np.float32)
    mass = np.bincount(mem.chunk, weights=a, minlength=S).astype(np.float32)
    trace.mass.append(torch.from_numpy(mass))
    trace.share.append(torch.from_numpy(mass.copy()))
    if columns is None:
        columns = a.copy()
    else:
        columns += a
    p = mass / max(float(mass.sum()), 1e-30)
    nz = p[p > 0]
    trace.attention_entropy.append(float(-(nz * np.log(nz)).sum()))
    return columns


def _trace_token_mass(trace: Trace, columns: np.ndarray, mem: PackedMemory) -> None:
    """trace.token_mass (S, Lm) from a row's per-column sums (_trace_step), scattered by mem.offset."""
    tok = np.zeros((len(mem.lengths), max(mem.lengths)), dtype=np.float32)
    tok[mem.chunk, mem.offset] = columns
    trace.token_mass = torch.from_numpy(tok)


def job_for(prompt_ids: list[int], memory: GenMemory | PackedMemory | None, sampling: Sampling, *, prior: float = 0.0,
            keep_logits: bool = False, cancelled: Callable[[], bool] = lambda: False) -> DecodeJob:
    """A DecodeJob of a prompt and (optionally) its memory, positions as Generator.generate gives them
    (`prior` applies to a GenMemory; a PackedMemory carries its own)."""
    pos = prompt_positions(len(prompt_ids), memory).tolist()
    packed = pack_memory(memory, prior) if isinstance(memory, GenMemory) else memory
    return DecodeJob(list(prompt_ids), pos, packed, sampling, keep_logits, cancelled)


def decode_loop(generator: Generator, layers: list[int], *, weights: str = "auto", threads: int = 1,
                max_batch: int = 16, cache_mb: float = 1024, kv: str = KV_DEFAULT, attention: str = "auto",
                attention_threads: int = 0, lanes: int = 0) -> DecodeLoop:
    """The continuous-batching decode loop of `generator`'s model with memory at `layers`: one per
    (weights, layers, threads, max_batch, cache_mb, kv cache format, attention, its threads and lanes), kept on the generator and
    shared by every engine that asks for the same. `attention` (an int8 cache's): `kernel` the C kernel
    (softknn.generate.kernel; ModelRuntimeError where it does not compile), `graph` ONNX Runtime's
    GroupQueryAttention, `auto` the kernel where it compiles (else graph, and a warning saying why)."""
    if attention not in ATTENTION:
        raise ValueError(f"decode attention must be one of {ATTENTION}, not {attention!r}")
    w = generator.weights(weights)
    key = (w, tuple(sorted(layers)), threads, max_batch, cache_mb, kv, attention, attention_threads, lanes)
    with generator.loops_lock:
        loop = generator.decode_loops.get(key)
        if loop is None:
            session = decoder_session(generator, w, list(key[1]), threads=threads, kv=kv, attention=attention,
                                      attention_threads=attention_threads, lanes=lanes)
            loop = generator.decode_loops[key] = DecodeLoop(session, generator.eos_ids, generator.tokenizer,
                                                            max_batch=max_batch, cache_mb=cache_mb)
        return cast("DecodeLoop", loop)
