"""Generation with the KB in attention: retrieve R (the sentence encoder, FAISS + BM25, w_db) →
place R's generator keys/values → decode with the memory hook → evidence per answer.

`GenEngine` holds the bundle's retrieval (a Retriever), the encoder that embeds the question for it,
and a Generator whose fingerprint the bundle's generator memory was built with. `stream` yields each token as it is chosen, then the answer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from softknn.common.errors import BundleError, InvalidInput
from softknn.common.table import FIXED_K, FIXED_PRIOR, GenParams, with_sources
from softknn.generate.attention import GenMemory, place_memory, placement
from softknn.generate.batch import PackedMemory, decode_loop, job_for, pack_chunks, pack_stored
from softknn.generate.graph import KV_DEFAULT
from softknn.generate.memory import ChunkKV, GeneratorStore
from softknn.generate.model import Generation, Generator, Sampling, Step
from softknn.generate.refusal import REFUSAL_TEXT, Grounding, judge
from softknn.infer.results import EvidenceItem, QueryToken, Span
from softknn.model.backends import ModelForward
from softknn.retrieval.search import InferParams, Retriever


@dataclass(frozen=True, kw_only=True)
class ResolvedGenParams(GenParams):
    """GenParams as a bundle serves them (GenEngine.resolve): k and prior set."""

    k: int
    prior: float


@dataclass(frozen=True)
class GenToken:
    index: int
    text: str
    memory_share: float  # Σ_c g_c for the query that produced this token (0 without memory)
    top_chunk: str | None  # the chunk it drew on the most


@dataclass(frozen=True)
class GenAnswer:
    text: str
    finish_reason: str
    usage: dict[str, int]
    evidence: list[EvidenceItem]
    diagnostics: dict[str, Any]
    tokens: list[GenToken]
    bundle_version: str
    generator: str
    grounded: bool | None = None  # the refusal verdict (softknn.generate.refusal); None: not judged

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Placed:
    """R's chunk K/V and where they go (softknn.generate.attention.place_memory's arguments)."""

    chunks: list[torch.Tensor]  # each (n_c, L, 2, nkv, hs); none where `laid`
    weight: torch.Tensor  # (S,) w_db
    positions: str
    encoded_after: int | list[int]
    prefix_len: int
    extents: list[int]
    lengths: list[int]  # each chunk's stored tokens (n_c)
    laid: list[tuple[np.ndarray, np.ndarray]] | None = None  # the decode loop's int8 columns a chunk (layout_stored)


@dataclass
class _Prepared:
    prefix: list[int]
    rest: list[int]
    placed: _Placed | None
    rows: list[int] = field(default_factory=list)
    retr: Any = None
    memory_source: str = "none"
    kept: list[np.ndarray | None] = field(default_factory=list)  # each slot's stored tokens (None: all)
    _memory: GenMemory | None = None
    _tokens: int | None = None  # memory_tokens, kept by `released`

    def released(self) -> _Prepared:
        """This preparation without R's float K/V (what the answer reads of R stays: rows, weights,
        its token count), once the decode loop holds its own copy of them."""
        if self.placed is None:
            return self
        return replace(self, placed=replace(self.placed, chunks=[], laid=None), _memory=None, _tokens=self.memory_tokens)

    def memory(self, gen: Generator, layers: list[int]) -> GenMemory | None:
        """R as the torch path takes it (padded slots), built once."""
        if self.placed is not None and self._memory is None:
            m = self.placed
            if m.laid is not None:
                raise ValueError("R was laid out for the decode graph only (prepare(..., laid=True))")
            self._memory = place_memory(m.chunks, layers, m.weight, m.positions, gen.inv_freq,
                                        encoded_after=m.encoded_after, prefix_len=m.prefix_len, extents=m.extents)
        return self._memory

    def packed(self, gen: Generator, layers: list[int], prior: float) -> PackedMemory | None:
        """R as the decode graph's cache columns take it (no padded copy)."""
        m = self.placed
        if m is None:
            return None
        if m.laid is not None:
            assert isinstance(m.encoded_after, int)
            return pack_stored(m.lengths, layers, m.weight, prior, m.positions, encoded_after=m.encoded_after,
                               prefix_len=m.prefix_len, extents=m.extents)
        return pack_chunks(m.chunks, layers, m.weight, prior, m.positions, gen.inv_freq, encoded_after=m.encoded_after,
                           prefix_len=m.prefix_len, extents=m.extents)

    @property
    def memory_tokens(self) -> int:
        if self._tokens is not None:
            return self._tokens
        return sum(self.placed.lengths) if self.placed is not None else 0


RUNTIMES = ("graph", "torch")


class GenEngine:
    """Generation over one bundle. `runtime` "graph" decodes joint mixing and the plain model in the
    decode graph with continuous batching (softknn.generate.batch; `weights` its format, `threads` its
    ONNX Runtime threads, `max_batch` the most sequences a step decodes, `kv_cache` its KV cache format:
    softknn.generate.graph, `attention` its attention: decode_loop); fixed α mixing, `exact`
    requests and runtime "torch" run the model in torch with the memory hook (the reference)."""

    def __init__(self, retriever: Retriever, encoder: ModelForward, generator: Generator, *, runtime: str = "graph",
                 weights: str = "auto", threads: int = 1, max_batch: int = 16, torch_concurrent: int = 2,
                 cache_mb: float = 1024, kv_cache: str = KV_DEFAULT, attention: str = "auto",
                 attention_threads: int = 0, lanes: int = 0):
        bundle = retriever.bundle
        rec = bundle.manifest.generator
        if rec is None:
            raise BundleError(f"{bundle.path}: built without a generator (softknn build --generator MODEL)",
                              field="bundle")
        if rec.fingerprint != generator.info.fingerprint:
            raise BundleError(f"{bundle.path}: generator memory built with other weights than "
                              f"{generator.info.name}", field="bundle")
        self.retriever, self.encoder, self.bundle = retriever, encoder, bundle
        self.generator = generator
        self.store = GeneratorStore(bundle.path, rec.model_dump(), len(bundle))
        self.layers = list(rec.layers)
        self._local = threading.local()
        if runtime not in RUNTIMES:
            raise ValueError(f"generation runtime must be one of {RUNTIMES}, not {runtime!r}")
        self.runtime, self.weights, self.threads, self.max_batch = runtime, weights, threads, max_batch
        self.cache_mb, self.kv_cache, self.attention = cache_mb, kv_cache, attention
        self.attention_threads, self.lanes = attention_threads, lanes
        self._torch_slots = threading.BoundedSemaphore(torch_concurrent)  # generations in torch at once

    def uses_graph(self, p: GenParams, has_memory: bool) -> bool:
        """Whether a request decodes in the decode graph (else in torch with the memory hook)."""
        return self.runtime == "graph" and not p.exact and (not has_memory or p.mixing == "joint")

    def warm_up(self) -> None:
        """Build the decode loop and decode one token of a one-token prompt through it (the graph's
        session opened, its first run's allocations made)."""
        job = job_for(self.generator.layout(prompt=" ")[1] or [0], None, Sampling(max_tokens=1))
        *_, last = self.decode_loop().submit(job)
        assert isinstance(last, Generation)

    def decode_loop(self):
        """The decode graph's loop for this bundle's memory layers (built on first use)."""
        return decode_loop(self.generator, self.layers, weights=self.weights, threads=self.threads,
                           max_batch=self.max_batch, cache_mb=self.cache_mb, kv=self.kv_cache,
                           attention=self.attention, attention_threads=self.attention_threads, lanes=self.lanes)

    def _graph_runtime(self) -> str:
        """`graph WEIGHTS KV ATTENTION` of the decode loop that answers: e.g. `graph w8a8 int8 kernel`."""
        s = self.decode_loop().session
        return f"graph {s.weights} {s.kv} {s.attention}"

    # --- retrieval and memory -------------------------------------------------------------------
    def retrieve(self, query: str, p: GenParams):
        p = self.resolve(p)
        ip = InferParams(k=p.k, retrieval=p.retrieval, lexical_weight=p.lexical_weight, temperature=p.knn_temperature,
                         exact=p.exact, evidence=0, filter=p.filter)
        ip = self.retriever.resolve([ip])[0]
        enc = self.encoder
        plain = enc.forward_plain(enc.tokenize([query], truncate=[True]))
        return self.retriever.retrieve(plain.embedding.float().cpu().numpy(), [ip], [query])

    def chunk_kv(self, rows: list[int], prefix: list[int], exact: bool, positions: str
                 ) -> tuple[list[ChunkKV], int | list[int], str]:
        """R's K/V, ChunkKV each, and where each was encoded (its first token's position). `exact`:
        recomputed in float32 after this prompt's prefix, each at its placed position; else from the
        store's LRU, its files, or (a recompute memory) computed after the memory prefix the builder
        uses, as the store would hold them."""
        if exact:
            ids = [self.store.token_ids(r) for r in rows]
            starts = None
            if positions == "reordered":
                starts = list(len(prefix) + np.concatenate([[0], np.cumsum([len(x) for x in ids])[:-1]]).astype(int))
            kv = self.generator.chunk_kv(ids, self.layers, prefix=prefix, starts=starts)
            return [ChunkKV(torch.from_numpy(x)) for x in kv], [int(s) for s in starts] if starts else len(prefix), \
                "recomputed"
        chunks = self.store.chunks(rows, self._recompute)
        source = "recomputed" if self.store.kind == "recompute" else f"stored {self.store.kind}"
        return chunks, self.store.prefix_len, source

    def _recompute(self, rows: list[int]) -> list[ChunkKV]:
        prefix = list(self.store.record.get("prefix") or [])
        kv = self.generator.chunk_kv([self.store.token_ids(r) for r in rows], self.layers, prefix=prefix)
        return [ChunkKV(torch.from_numpy(x)) for x in kv]

    def defaults(self) -> tuple[int, float, str]:
        """(k, β, where they come from): the bundle's calibration record, else the fixed defaults."""
        cal = self.store.record.get("calibration") or {}
        if "k" in cal and "prior" in cal:
            return int(cal["k"]), float(cal["prior"]), "calibrated"
        return FIXED_K, FIXED_PRIOR, "fixed"

    def prior_for(self, k: int) -> float | None:
        """The β the calibration chose among its cells at k (the largest grid k ≤ k), or None."""
        by_k = (self.store.record.get("calibration") or {}).get("prior_by_k") or {}
        below = [int(kk) for kk in by_k if int(kk) <= k]
        return float(by_k[str(max(below))]) if below else None

    def resolve(self, p: GenParams) -> ResolvedGenParams:
        """p validated, with k and prior filled in from `defaults` where the request left them unset (a
        request's own k gets the β calibrated at that k)."""
        if isinstance(p, ResolvedGenParams):
            return p
        k, prior, where = self.defaults()
        p = p.validate()
        values = {f.name: getattr(p, f.name) for f in fields(p)}
        src = {name: "bundle" if where == "calibrated" else "default" for name in ("k", "prior") if values[name] is None}
        if p.prior is None and p.k is not None:
            at_k = self.prior_for(p.k)
            prior, src["prior"] = (prior, src["prior"]) if at_k is None else (at_k, "bundle")
        retrieval = InferParams(retrieval=p.retrieval, lexical_weight=p.lexical_weight, temperature=p.knn_temperature)
        src |= dict(self.retriever.resolve([retrieval])[0].sources)  # what the bundle's retrieval filled in
        return with_sources(ResolvedGenParams(**{**values, "k": k if p.k is None else p.k,
                                                 "prior": prior if p.prior is None else p.prior}), **src)

    def prepare(self, p: GenParams, prompt: str | None, messages: list[dict] | None, *,
                refused_bare: bool = False, laid: bool = False) -> _Prepared:
        """The prompt's tokens and R: retrieval, then R's keys/values placed (memory) or its texts in the
        prompt. `refused_bare`: a question the refusal rule refuses (`grounding`) stops after retrieval,
        its R never loaded (stream answers it with REFUSAL_TEXT, which attends to nothing). `laid`: where the
        request decodes in the graph with an int8 cache and R's chunks stay where they were encoded, R is
        laid out as the cache's columns straight from the store (KVCache.layout_stored), with no float rows
        (the preparation then serves the graph only)."""
        p = self.resolve(p)
        gen = self.generator
        query = prompt if prompt is not None else _last_user(messages)
        if not p.use_kb:
            prefix, rest = gen.layout(prompt, messages)
            return _Prepared(prefix, rest, None)
        retr = self.retrieve(query, p)
        rows, w = retr.rows[0], retr.weights[0]
        chunks = self.bundle.chunks
        if refused_bare and rows and self.grounding(p, _Prepared([], [], None, rows, retr)).refused:
            prefix, rest = gen.layout(prompt, messages)
            return _Prepared(prefix, rest, None, rows, retr, "none")
        if p.context == "prompt" or not rows:
            prefix, rest = gen.layout(prompt, messages, context=[chunks[r]["text"] for r in rows] if rows else None)
            return _Prepared(prefix, rest, None, rows, retr, "prompt" if rows else "none")
        prefix, rest = gen.layout(prompt, messages)
        # exact: fp32 K/V encoded after this very prefix, so the masked-concatenation contract holds
        recompute = p.exact and (self.store.kind != "fp32" or self.store.keep < 1 or p.positions == "reordered"
                                 or list(prefix) != list(self.store.record.get("prefix") or []))
        if laid and not recompute and self.uses_graph(p, True):
            stored = self._laid(rows, prefix, p.positions, w)
            if stored is not None:
                return _Prepared(prefix, rest, stored, rows, retr, f"stored {self.store.kind}",
                                 [self.store.placed_as(r)[2] for r in rows])
        kvs, encoded_after, source = self.chunk_kv(rows, prefix, recompute, p.positions)
        placed = _Placed([c.kv for c in kvs], torch.tensor(w), p.positions, encoded_after, len(prefix),
                         [c.extent for c in kvs], [int(c.kv.shape[0]) for c in kvs])
        return _Prepared(prefix, rest, placed, rows, retr, source, [c.kept for c in kvs])

    def _laid(self, rows: list[int], prefix: list[int], positions: str, weight: Any) -> _Placed | None:
        """R laid out for the decode loop's int8 cache from the store's bytes (prepare's `laid`), or None where
        that does not apply (another cache or attention, a recompute or int8 memory, chunks that move)."""
        cache = self.decode_loop().cache
        if self.store.kind == "recompute" or not cache.lays_stored(self.store.kind):
            return None
        placed = [self.store.placed_as(r) for r in rows]
        lengths, extents = [n for n, _, _ in placed], [e for _, e, _ in placed]
        shifts, _ = placement(lengths, positions, encoded_after=self.store.prefix_len, prefix_len=len(prefix),
                              extents=extents)
        if any(shifts):
            return None
        return _Placed([], torch.tensor(weight), positions, self.store.prefix_len, len(prefix), extents, lengths,
                       cache.layout_stored(self.store, rows))

    # --- decoding ---------------------------------------------------------------------------------
    def stream(self, p: GenParams, prompt: str | None = None, messages: list[dict] | None = None, *,
               cancelled: Callable[[], bool] = lambda: False, keep_logits: bool = False) -> Iterator[Step | GenAnswer]:
        """Yields a Step per generated token, then the GenAnswer. A question the bundle's refusal rule
        refuses (`grounding`) gets REFUSAL_TEXT's tokens and nothing is decoded."""
        p = self.resolve(p)
        with self._occupying():  # retrieval takes a core: the decode loop's lanes wait
            prep = self.prepare(p, prompt, messages, refused_bare=True, laid=True)
        verdict = self.grounding(p, prep)
        sampling = Sampling(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, stop=tuple(p.stop),
                            seed=p.seed, ignore_eos=p.ignore_eos)
        result: Generation | None = None
        if verdict.refused:
            prep = replace(prep, placed=None, memory_source="none")
            items: Iterator[Step | Generation] = self._refusal(prep)
        elif self.uses_graph(p, prep.placed is not None):
            job = job_for(prep.prefix + prep.rest, prep.packed(self.generator, self.layers, p.prior), sampling,
                          keep_logits=keep_logits, cancelled=cancelled)
            if prep.placed is not None and prep.placed.laid is not None:
                job.laid = prep.placed.laid
            items = self.decode_loop().submit(job)
            if job.memory is not None and not job.memory.kv:  # laid out for an int8 cache: the float copies can go
                prep = prep.released()
        else:
            items = self._in_torch(prep, p, sampling, keep_logits, cancelled)
        for item in items:
            if isinstance(item, Generation):
                result = item
            else:
                yield item
        assert result is not None
        self._local.generation = result  # per thread: concurrent generations share the engine
        answer = self._answer(result, prep, p)
        diag = {**answer.diagnostics, "grounding": verdict.to_dict(), **({"runtime": None} if verdict.refused else {})}
        yield replace(answer, grounded=verdict.grounded, diagnostics=diag)

    def grounding(self, p: GenParams, prep: _Prepared) -> Grounding:
        """The refusal verdict (softknn.generate.refusal.judge): R's retrieval s₁ against the threshold in the
        bundle's generator calibration; not judged without retrieval or without a threshold."""
        record = (self.store.record.get("calibration") or {}).get("refusal")
        return judge(prep.retr.nearest[0] if prep.retr is not None else None, record, p.refuse)

    def _refusal(self, prep: _Prepared) -> Iterator[Step | Generation]:
        """REFUSAL_TEXT as the answer's tokens, whole whatever max_tokens: nothing is decoded."""
        ids = self.generator._ids(REFUSAL_TEXT)
        for t in ids:
            yield Step(t, self.generator.tokenizer.decode([t], skip_special_tokens=True))
        yield Generation(ids, REFUSAL_TEXT, "stop", len(prep.prefix) + len(prep.rest))

    def _in_torch(self, prep: _Prepared, p: ResolvedGenParams, sampling: Sampling, keep_logits: bool,
                  cancelled: Callable[[], bool]) -> Iterator[Step | Generation]:
        with self._torch_slots, self._occupying():  # a core for as long as it runs
            yield from self.generator.generate(prep.prefix + prep.rest, prep.memory(self.generator, self.layers),
                                               sampling=sampling, mixing=p.mixing,
                                               alpha=p.alpha, keep_logits=keep_logits, cancelled=cancelled,
                                               prior=p.prior)

    def _occupying(self):
        """The decode loop's `occupied` (lanes off while work beside it takes a core), where it runs one."""
        return self.decode_loop().occupied() if self.runtime == "graph" else nullcontext()

    @property
    def last_generation(self) -> Generation:
        """This thread's last Generation (token ids, and logits where kept): for tests and benchmarks."""
        return self._local.generation

    def score(self, p: GenParams, continuation: str, prompt: str | None = None, messages: list[dict] | None = None) -> float:
        """Mean NLL per token of `continuation` (tokenised as it is) as the answer, R as `stream` gets it."""
        p = self.resolve(p)
        prep = self.prepare(p, prompt, messages)
        cont = self.generator._ids(continuation)
        return self.generator.score(prep.prefix + prep.rest, cont, prep.memory(self.generator, self.layers),
                                    mixing=p.mixing, alpha=p.alpha,
                                    prior=p.prior)

    def answer(self, p: GenParams, prompt: str | None = None, messages: list[dict] | None = None, **kw) -> GenAnswer:
        *_, last = self.stream(p, prompt, messages, **kw)
        assert isinstance(last, GenAnswer)
        return last

    # --- evidence ---------------------------------------------------------------------------------
    def _answer(self, g: Generation, prep: _Prepared, p: ResolvedGenParams) -> GenAnswer:
        gen = self.generator
        pieces = [gen.tokenizer.decode([t], skip_special_tokens=True) for t in g.token_ids]
        n = len(g.token_ids)
        trace = g.trace
        chunks = self.bundle.chunks
        rows = prep.rows
        evidence: list[EvidenceItem] = []
        tokens: list[GenToken] = []
        mass = torch.stack(trace.mass[:n]) if trace is not None and n and trace.mass else None  # (n, S)
        share = torch.stack(trace.share[:n]) if mass is not None and trace is not None else None  # mass implies trace
        # the chunk each token drew on most: by its mass (joint), or by its scores' own share (fixed, where
        # the mass is (1−α)·w_db for every token)
        pick = mass if p.mixing == "joint" else share
        for t in range(n):
            top = None if pick is None else chunks[rows[int(pick[t].argmax())]]["chunk_id"]
            tokens.append(GenToken(t, pieces[t], 0.0 if mass is None else float(mass[t].sum()), top))
        retr = prep.retr
        if retr is not None and rows:
            per_chunk = mass.mean(0) if mass is not None else torch.zeros(len(rows))
            order = sorted(range(len(rows)), key=lambda s: (-float(per_chunk[s]), -retr.weights[0][s]))[: p.evidence]
            ends = np.cumsum([len(x) for x in pieces]).tolist()  # each token's end in the answer's text
            matched = self.retriever.matched_words_rows(retr, 0, [rows[s] for s in order])
            bm25 = retr.bm25[0]
            for rank, (s, words) in enumerate(zip(order, matched, strict=True)):
                c = chunks[rows[s]]
                kept = prep.kept[s] if prep.kept else None
                spans = self._spans(c, trace, s, p.spans, kept, float(per_chunk[s])) if trace is not None and n else []
                drew = [] if share is None else [int(i) for i in share[:, s].argsort(descending=True)[:3]]
                evidence.append(EvidenceItem(
                    rank=rank, chunk_id=c["chunk_id"], doc_id=c["doc_id"], text=c["text"], start=c["start"],
                    end=c["end"], label=c.get("label"), metadata=c.get("metadata") or {},
                    similarity=float(retr.scores[0][s]), dense_similarity=float(retr.dense[0][s]),
                    bm25=None if bm25 is None else float(bm25[s]), matched_terms=words,
                    weight=float(retr.weights[0][s]), mass_share=float(per_chunk[s]), influence=None, spans=spans,
                    query_tokens=[QueryToken(t, pieces[t], ends[t] - len(pieces[t]), ends[t], float(mass[t, s]))
                                  for t in drew] if mass is not None else [],
                    tokens=drew))
        w = np.asarray(retr.weights[0]) if retr is not None and rows else np.zeros(0)
        h_w = float(-(w[w > 0] * np.log(w[w > 0])).sum()) if w.size else 0.0
        h_att = float(np.mean(trace.attention_entropy[:n])) if trace is not None and n and trace.attention_entropy else 0.0
        diag = {
            "memory_share": 0.0 if mass is None else float(mass.sum(-1).mean()),
            "retrieved": len(rows), "k": p.k, "mixing": p.mixing if prep.placed is not None else None,
            "alpha": p.alpha if p.mixing == "fixed" else None, "positions": p.positions,
            "prior": p.prior if p.mixing == "joint" else None,
            "defaults": self.defaults()[2],
            "sources": dict(p.sources),
            "retrieval": retr.searched[0] and _mode(self.retriever, p) if retr is not None else None,
            "memory_layers": len(self.layers) if prep.placed is not None else 0,
            "memory_tokens": prep.memory_tokens,
            "memory_source": prep.memory_source,
            "runtime": self._graph_runtime() if self.uses_graph(p, prep.placed is not None) else "torch",
            "w_db_entropy": h_w, "w_db_effective_k": math.exp(h_w),
            "attention_effective_k": math.exp(h_att),
            "exact": p.exact,
            "filtered": retr.filtered[0] if retr is not None else None,
        }
        usage = {"prompt_tokens": g.prompt_tokens, "completion_tokens": n, "total_tokens": g.prompt_tokens + n}
        return GenAnswer(g.text, g.finish_reason, usage, evidence, diag, tokens, self.bundle.version,
                         self.generator.info.name)

    def _spans(self, c: dict, trace, s: int, top: int, kept: np.ndarray | None, mass_share: float) -> list[Span]:
        """The chunk's words whose tokens drew the most mass, as char spans in the chunk's document: each
        its share of the chunk's mass, and that share of `mass_share` as its weight (`kept`: the chunk
        token each memory slot position holds, where the store kept only some)."""
        tm = trace.token_mass[s]  # (Lm,)
        offsets = self.generator.chunk_offsets(c["text"])
        where = np.arange(len(offsets)) if kept is None else np.asarray(kept)
        nt = min(len(where), int(tm.shape[0]))
        if nt == 0:
            return []
        total = float(tm[:nt].sum()) or 1.0
        out: list[Span] = []
        seen: set[str] = set()
        for i in tm[:nt].argsort(descending=True).tolist():
            if where[i] >= len(offsets):
                continue
            a, b = offsets[where[i]]
            word = c["text"][a:b].strip()
            if not any(ch.isalnum() for ch in word) or word.lower() in _FUNCTION_WORDS or word.lower() in seen:
                continue  # punctuation, function words and repeats draw mass but tell a reader nothing
            seen.add(word.lower())
            part = float(tm[i]) / total
            out.append(Span(start=c["start"] + a, end=c["start"] + b, text=word, weight=part * mass_share, share=part,
                            query_tokens=[]))
            if len(out) == top:
                break
        return out


_FUNCTION_WORDS = frozenset("the a an and or of to in on at for from by with is are be it this that as".split())


def _last_user(messages: list[dict] | None) -> str:
    for m in reversed(messages or []):
        if m.get("role") == "user":
            return str(m.get("content") or "")
    raise InvalidInput("messages need a user message", field="messages")


def _mode(retriever: Retriever, p: GenParams) -> str:
    return retriever.resolve([InferParams(retrieval=p.retrieval)])[0].retrieval or "dense"


__all__ = ["EvidenceItem", "GenAnswer", "GenEngine", "GenParams", "GenToken", "replace"]
