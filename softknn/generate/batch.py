"""Continuous batching over the decode graph: the retrieved chunks' keys/values in the KV cache, one
joint softmax with the k-NN prior as a float mask, and requests that join and leave the running
batch at every step.

A request's memory (softknn.generate.attention.GenMemory: R's keys after RoPE at their placed positions,
and values) is written once into the first M columns of its row of the cache; its prompt and
generated tokens follow. The mask row of the request holds

    β·log(|R|·w_db(c))  on chunk c's M columns          (0 for β = 0: the plain joint softmax)
    0                   on its own tokens so far
    −inf                on every other column (not yet written, or another length's padding)

so each step is the model's own attention over [R's tokens ; own context] — what MemoryHook computes
in joint mixing (softknn.generate.attention), with the chat template's prefix rows facing no memory.

`DecodeLoop` (one per model, weights and memory layers: `decode_loop`) runs one thread: it prefills each new request alone (B = 1, T prompt tokens), then
decodes every running request in one batch (B rows, T = 1), and hands each its Step as chosen.
`Generator.generate` with a MemoryHook is the plain reference the tests compare with.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from softknn.common.errors import InvalidInput
from softknn.generate.attention import GenMemory, Trace, prompt_positions
from softknn.generate.model import Generation, Generator, Sampling, Step, TextStream, choose_token
from softknn.generate.runtime import DecoderSession

log = logging.getLogger(__name__)
COLUMN_BLOCK = 128  # the cache grows in blocks of this many columns
NEG_INF = float("-inf")


@dataclass
class PackedMemory:
    """R's K/V laid out as cache columns: keys[ℓ] (nkv, M, hs), values[ℓ] (nkv, hs, M) for each memory
    layer, `bias` (M,) the prior on each column, `chunk` (M,) the slot of each column's chunk."""

    keys: dict[int, np.ndarray]
    values: dict[int, np.ndarray]
    bias: np.ndarray
    chunk: np.ndarray
    lengths: list[int]
    prefix_len: int

    @property
    def columns(self) -> int:
        return int(self.bias.shape[0])


def pack_memory(memory: GenMemory, prior: float) -> PackedMemory:
    """GenMemory (padded slots) → cache columns, chunk after chunk, with the prior of MemoryHook:
    β·log(|R|·w_db(c)) computed in float64 and rounded to float32."""
    mask = memory.token_mask  # (S, Lm)
    keys, values = {}, {}
    for layer, lm in memory.layers.items():
        keys[layer] = np.ascontiguousarray(lm.key[:, mask].numpy(), dtype=np.float32)  # (nkv, M, hs)
        values[layer] = np.ascontiguousarray(lm.value[:, mask].transpose(1, 2).numpy(), dtype=np.float32)  # (nkv, hs, M)
    chunk = torch.arange(mask.shape[0])[:, None].expand_as(mask)[mask].numpy()  # (M,)
    if prior:
        log_prior = (prior * torch.log(memory.weight.double().clamp(min=1e-30) * memory.slots)).float().numpy()
        bias = log_prior[chunk].astype(np.float32)
    else:
        bias = np.zeros(chunk.shape[0], dtype=np.float32)
    return PackedMemory(keys, values, bias, chunk, list(memory.lengths), memory.prefix_len)


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


class KVCache:
    """Preallocated cache rows: keys[ℓ] (B, nkv, C, hs), values[ℓ] (B, nkv, hs, C) and the additive
    mask rows bias (B, C) (memory layers) and bias_plain (B, C) (layers without memory). Running
    sequences hold rows 0..n−1; C and B grow in blocks (copying), never shrink while in use."""

    def __init__(self, layers: int, nkv: int, hs: int):
        self.L, self.nkv, self.hs = layers, nkv, hs
        self.B, self.C = 0, 0
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.bias = np.zeros((0, 0), dtype=np.float32)
        self.bias_plain = np.zeros((0, 0), dtype=np.float32)

    def ensure(self, rows: int, columns: int, used: int) -> None:
        """Room for `rows` rows of `columns` columns; the first `used` rows are kept."""
        if rows <= self.B and columns <= self.C:
            return
        B, C = max(rows, self.B), max(self.C, COLUMN_BLOCK * math.ceil(columns / COLUMN_BLOCK))
        keys = [np.zeros((B, self.nkv, C, self.hs), dtype=np.float32) for _ in range(self.L)]
        values = [np.zeros((B, self.nkv, self.hs, C), dtype=np.float32) for _ in range(self.L)]
        bias = np.full((B, C), NEG_INF, dtype=np.float32)
        bias_plain = np.full((B, C), NEG_INF, dtype=np.float32)
        if used:
            for li in range(self.L):
                keys[li][:used, :, : self.C] = self.keys[li][:used]
                values[li][:used, :, :, : self.C] = self.values[li][:used]
            bias[:used, : self.C] = self.bias[:used]
            bias_plain[:used, : self.C] = self.bias_plain[:used]
        self.keys, self.values, self.bias, self.bias_plain, self.B, self.C = keys, values, bias, bias_plain, B, C

    def move(self, src: int, dst: int) -> None:
        for li in range(self.L):
            self.keys[li][dst] = self.keys[li][src]
            self.values[li][dst] = self.values[li][src]
        self.bias[dst] = self.bias[src]
        self.bias_plain[dst] = self.bias_plain[src]

    def write(self, rows: np.ndarray, cols: np.ndarray, out: dict[str, np.ndarray], T: int) -> None:
        """The graph's new keys/values (B, nkv, T, hs) into rows `rows` at columns cols[b]..cols[b]+T−1."""
        for li in range(self.L):
            k, v = out[f"key_{li}"], out[f"value_{li}"]
            if T == 1:
                self.keys[li][rows, :, cols] = k[:, :, 0, :]  # (B, nkv, hs)
                self.values[li][rows, :, :, cols] = v[:, :, 0, :]
            else:
                for j, (r, c) in enumerate(zip(rows, cols)):
                    self.keys[li][r, :, c : c + T] = k[j]
                    self.values[li][r, :, :, c : c + T] = v[j].transpose(0, 2, 1)


class DecodeLoop:
    """The generation thread of one GenEngine: requests join at their prefill and leave when done."""

    def __init__(self, session: DecoderSession, eos_ids: set[int], tokenizer, *, max_batch: int = 16,
                 wide: DecoderSession | None = None):
        self.session = session  # one sequence, one token: q4's 4-bit kernels win here
        # prefills (T > 1) and batched steps (B > 1): the float32 GEMM, whose cost grows least with the
        # rows (bench/gen_serving.py measured MatMulNBits' float path at B = 4 as 3× its B = 1)
        self.wide = wide if wide is not None else session
        self.shape = session.shape
        self.eos_ids, self.tokenizer = eos_ids, tokenizer
        self.max_batch = max_batch
        self.mem_layers = set(session.memory_layers)
        self.cache = KVCache(self.shape.layers, self.shape.kv_heads, self.shape.head_dim)
        self.running: list[_Seq] = []
        self._inbox: queue.Queue[DecodeJob | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._hold = threading.Lock()  # taken by the loop around each round (paused())
        self._bound: tuple | None = None  # ((n, C, cache id), Bound) of the last decode step
        self.steps = 0  # batched decode steps run (tests, metrics)
        self.max_running = 0

    # --- the caller's side --------------------------------------------------------------------
    def submit(self, job: DecodeJob) -> Iterator[Step | Generation]:
        """Queue the job now; the iterator yields its Steps as the loop chooses them, then its
        Generation. Closing the iterator early cancels the job at its next step."""
        self._check(job)
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
    def paused(self):
        """Hold the loop between steps (jobs submitted meanwhile join together when it resumes)."""
        with self._hold:
            yield self

    def _check(self, job: DecodeJob) -> None:
        if not job.prompt_ids:
            raise InvalidInput("the prompt has no tokens", field="prompt")
        last = max(job.positions) + job.sampling.max_tokens
        if last >= self.shape.max_positions:
            raise InvalidInput(f"prompt and max_tokens reach position {last}; the generator has "
                               f"{self.shape.max_positions}", field="max_tokens")
        if job.memory is not None and set(job.memory.keys) != self.mem_layers:
            raise ValueError(f"memory at layers {sorted(job.memory.keys)}, the decode graph at {sorted(self.mem_layers)}")

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="softknn-decode", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._inbox.put(None)

    # --- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = None
            if len(self.running) < self.max_batch:
                try:
                    job = self._inbox.get(block=not self.running)
                except queue.Empty:
                    pass
                else:
                    if job is None:  # close(): the running sequences end as cancelled
                        for seq in list(self.running):
                            self._finish(seq, "cancelled")
                        return
            with self._hold:
                try:
                    self._round(job)
                except Exception as e:  # noqa: BLE001 - a bug in a step fails the running requests, not the loop
                    log.exception("decode loop step failed; failing %d running generation(s)", len(self.running))
                    for seq in self.running:
                        seq.job.out.put(e)
                    self.running = []
                    self._bound = None

    def _round(self, job: DecodeJob | None) -> None:
        """Prefill `job` and whatever else waits (up to max_batch running), then one decode step of the batch."""
        joined = [job] if job is not None else []
        while len(self.running) + len(joined) < self.max_batch:
            try:
                nxt = self._inbox.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._inbox.put(None)
                break
            joined.append(nxt)
        for j in joined:
            self._prefill(j)
        if self.running:
            self._step()

    def _finish(self, seq: _Seq, reason: str | None = None) -> None:
        if reason is not None:
            seq.gen.finish_reason = reason
        seq.gen.token_ids, seq.gen.text = seq.text.token_ids, seq.text.text
        seq.job.out.put(seq.gen)
        self._drop(seq)

    def _drop(self, seq: _Seq) -> None:
        i = self.running.index(seq)
        last = self.running[-1]
        if last is not seq:
            self.cache.move(last.slot, seq.slot)
            last.slot = seq.slot
            self.running[i] = last
        self.running.pop()

    def _emit(self, seq: _Seq, logits: np.ndarray, attn: np.ndarray | None) -> None:
        """Choose seq's next token from its logits (V,); record the trace; finish it when done."""
        job = seq.job
        lt = torch.from_numpy(logits)  # a view of the step's output buffer: copied where it is kept
        if seq.gen.trace is not None and attn is not None and job.memory is not None:
            _trace_step(seq.gen.trace, attn[: job.memory.columns], job.memory)
        tok = choose_token(lt, job.sampling, seq.rng)
        kept = lt.clone() if job.keep_logits else None
        if kept is not None:
            seq.gen.logits.append(kept)
        step = seq.text.add(tok, kept)
        seq.steps += 1
        if step is not None:
            job.out.put(step)
        if seq.text.finished:
            self._finish(seq, "stop")
        elif seq.steps >= job.sampling.max_tokens:
            self._finish(seq, "length")
        else:
            seq.last = tok

    def _prefill(self, job: DecodeJob) -> None:
        try:
            if job.cancelled():
                gen = Generation(prompt_tokens=len(job.prompt_ids), finish_reason="cancelled")
                job.out.put(gen)
                return
            self._prefill_one(job)
        except Exception as e:  # noqa: BLE001 - the failure goes back to its request only
            job.out.put(e)

    def _prefill_one(self, job: DecodeJob) -> None:
        mem = job.memory
        M = mem.columns if mem is not None else 0
        T = len(job.prompt_ids)
        need = M + T + job.sampling.max_tokens
        n = len(self.running)
        self.cache.ensure(n + 1, need, n)
        c = self.cache
        slot = n
        P = mem.prefix_len if mem is not None else 0
        c.bias[slot], c.bias_plain[slot] = NEG_INF, NEG_INF
        if mem is not None:
            for li in self.mem_layers:
                c.keys[li][slot, :, :M] = mem.keys[li]
                c.values[li][slot, :, :, :M] = mem.values[li]
            c.bias[slot, :M] = mem.bias
        # rows: the cache (memory) columns, then the T new ones, causal; prefix rows face no memory
        C = c.C
        bias = np.full((1, 1, T, C + T), NEG_INF, dtype=np.float32)
        bias[0, 0, :, :C] = c.bias[slot]
        bias[0, 0, :P, :C] = NEG_INF
        bias[0, 0, :, C:] = np.where(np.tri(T, dtype=bool), 0.0, NEG_INF)
        plain = bias.copy()
        plain[0, 0, :, :M] = NEG_INF
        g = self.shape.groups
        out = self.wide.run(np.array([job.prompt_ids], dtype=np.int64), np.array([job.positions], dtype=np.int64),
                               np.tile(bias, (1, 1, g, 1)), np.tile(plain, (1, 1, g, 1)),
                               [k[slot : slot + 1] for k in c.keys], [v[slot : slot + 1] for v in c.values])
        c.write(np.array([slot]), np.array([M]), out, T)
        c.bias[slot, M : M + T] = 0.0
        c.bias_plain[slot, M : M + T] = 0.0
        trace = Trace() if mem is not None else None
        rng = torch.Generator().manual_seed(job.sampling.seed) if job.sampling.seed is not None else None
        seq = _Seq(job, slot, M + T, max(job.positions) + 1, TextStream(self.tokenizer, self.eos_ids, job.sampling.stop),
                   Generation(prompt_tokens=T, trace=trace), rng)
        self.running.append(seq)
        self.max_running = max(self.max_running, len(self.running))
        attn = out.get("attn")
        self._emit(seq, out["logits"][0], None if attn is None else attn[0])

    def _step(self) -> None:
        for seq in [s for s in self.running if s.job.cancelled()]:
            self._finish(seq, "cancelled")
        if not self.running:
            return
        seqs = list(self.running)
        n, c = len(seqs), self.cache
        rows = np.arange(n)
        cols = np.array([s.length for s in seqs])
        c.ensure(n, int(cols.max()) + 1, n)
        C = c.C
        bias = np.zeros((n, 1, 1, C + 1), dtype=np.float32)
        bias[:, 0, 0, :C] = c.bias[:n]
        plain = np.zeros((n, 1, 1, C + 1), dtype=np.float32)
        plain[:, 0, 0, :C] = c.bias_plain[:n]
        g = self.shape.groups
        key = (n, C, id(c.keys[0]))
        if self._bound is None or self._bound[0] != key:  # the batch or the cache changed: bind again
            session = self.session if n == 1 else self.wide
            self._bound = (key, session.bind([k[:n] for k in c.keys], [v[:n] for v in c.values], n, 1))
        try:
            out = self._bound[1].run(np.array([[s.last] for s in seqs], dtype=np.int64),
                                     np.array([[s.next_pos] for s in seqs], dtype=np.int64),
                                     np.tile(bias, (1, 1, g, 1)), np.tile(plain, (1, 1, g, 1)))
        except Exception as e:  # noqa: BLE001 - a failed step fails the requests in it, not the loop
            for s in seqs:
                s.job.out.put(e)
                self._drop(s)
            return
        self.steps += 1
        c.write(rows, cols, out, 1)
        c.bias[rows, cols] = 0.0
        c.bias_plain[rows, cols] = 0.0
        attn = out.get("attn")
        for j, s in enumerate(seqs):
            s.length += 1
            s.next_pos += 1
            self._emit(s, out["logits"][j], None if attn is None else attn[j])


def _trace_step(trace: Trace, attn: np.ndarray, mem: PackedMemory) -> None:
    """One token's memory mass from the graph's attention row over the memory columns (M,): per
    chunk the sum of its columns (the joint gate g_c, = its share), per chunk token the column."""
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


def job_for(prompt_ids: list[int], memory: GenMemory | None, sampling: Sampling, *, prior: float = 0.0,
            keep_logits: bool = False, cancelled: Callable[[], bool] = lambda: False) -> DecodeJob:
    """A DecodeJob of a prompt and (optionally) a GenMemory, positions as Generator.generate gives them."""
    pos = prompt_positions(len(prompt_ids), memory).tolist()
    packed = pack_memory(memory, prior) if memory is not None else None
    return DecodeJob(list(prompt_ids), pos, packed, sampling, keep_logits, cancelled)


def decode_loop(generator: Generator, layers: list[int], *, weights: str = "auto", threads: int = 1,
                max_batch: int = 16) -> DecodeLoop:
    """The continuous-batching decode loop of `generator`'s model with memory at `layers`: one per
    (weights, layers), kept on the generator and shared by every engine that asks for it."""
    w = generator.weights(weights)
    key = (w, tuple(sorted(layers)))
    with generator.loops_lock:
        loop = generator.decode_loops.get(key)
        if loop is None:
            session = DecoderSession(generator.model, w, list(key[1]), threads=threads)
            # q4's prefills and batched steps run the same numbers in float32 (MatMulNBits' float path
            # costs more per row there than the float32 GEMM)
            wide = DecoderSession(generator.model, "fp32", list(key[1]), threads=threads) if w == "q4" else None
            loop = generator.decode_loops[key] = DecodeLoop(session, generator.eos_ids, generator.tokenizer,
                                                            max_batch=max_batch, wide=wide)
        return cast("DecodeLoop", loop)
