"""read → chunk → encode (embedding and layer-L K/V in one pass) → FAISS index → bundle.

Resumable: every batch of encoded chunks is written as a shard directory, renamed into place
when complete, under `.<out>.partial/`. A rerun with the same input and settings skips finished
shards, so a build killed at any point finishes with the same bytes as one never interrupted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import faiss
import numpy as np
import torch
from tqdm import tqdm

from softknn.common.errors import BundleError, KBFormatError
from softknn.generate.model import Generator
from softknn.index_builder.chunker import Chunk, chunk_documents
from softknn.index_builder.encode_cache import chunk_key
from softknn.index_builder.generator_memory import GeneratorBuild, plan_record, write_generator_memory
from softknn.index_builder.reader import Fields, read_kb
from softknn.infer.engine import InferParams
from softknn.model.encoder import Encoder
from softknn.retrieval.calibration import calibrate_loo, calibrate_unlabelled
from softknn.retrieval.chunk_index import build_index, choose_index
from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import CANDIDATES
from softknn.storage.bundle import finalize
from softknn.storage.layout import allocated_memmap, atomic_write_bytes, data_files, save_array, verify_bundle
from softknn.storage.memory_stores import (
    DEFAULT_MEMORY,
    HIDDEN_DTYPES,
    check_kind,
    check_kv_dtype,
    int8_scale,
    quantize_int8,
)

log = logging.getLogger(__name__)
KV_DTYPES = {"float32": np.float32, "float16": np.float16}
T = TypeVar("T")

# encode(encoder, chunks, [(batch number, chunk rows)], layer, cfg) -> (batch number, encode_batch's arrays)...
EncodeStrategy = Callable[[Encoder, list[Chunk], list[tuple[int, list[int]]], int, "BuildConfig"],
                          Iterable[tuple[int, dict[str, np.ndarray]]]]


@dataclass
class BuildConfig:
    layer: int = -1  # memory layer, 0-based; negative counts from the last
    index_type: str = "auto"
    index_params: dict = field(default_factory=dict)
    chunk_tokens: int | None = None  # default: the model's max_seq_length − 8 (room for specials)
    overlap: int = 32
    batch_size: int = 32
    kv_dtype: str = "float32"  # of stored K/V (memory "kv" only)
    memory: str = DEFAULT_MEMORY  # the memory representation: softknn.storage.memory_stores.MEMORY_KINDS
    fields: Fields = field(default_factory=Fields)
    lexical: bool = True  # write the BM25 index (softknn.retrieval.lexical) beside the FAISS index
    calibrate: bool = True  # labelled: λ, τ and the abstain rule by leave-one-out; unlabelled: λ from pseudo-queries (softknn.retrieval.calibration)
    shards: int = 1  # > 1: one bundle of that many shards, contiguous row ranges (softknn.storage.shards)
    generator_layers: str = "all"  # with a generator: its memory layers (softknn.index_builder.generator_memory)
    generator_memory: str = GeneratorBuild.memory  # with a generator: how its K/V are stored (softknn.generate.memory)
    generator_keep: float = 1.0  # with a generator: the fraction of each chunk's tokens stored
    generator_calibrate: bool = True  # with a generator and calibrate: k and β from the KB (softknn.generate.calibration);
    # without it, calibrate still sets the refusal threshold (softknn.generate.refusal: retrieval only)


def _plan_hash(chunks: list[Chunk], cfg: BuildConfig, encoder: Encoder, layer: int, generator: dict | None = None) -> str:
    h = hashlib.sha256()
    if generator is not None:
        h.update(json.dumps(generator, sort_keys=True).encode())
    h.update(encoder.info.fingerprint.encode())
    if encoder.info.precision != "fp32":  # shards of other numerics must not be resumed into this build
        h.update(encoder.info.precision.encode())
    settings = {"layer": layer, "chunk_tokens": cfg.chunk_tokens, "overlap": cfg.overlap,
                "batch_size": cfg.batch_size, "kv_dtype": cfg.kv_dtype, "memory": cfg.memory}
    h.update(json.dumps(settings, sort_keys=True).encode())
    for c in chunks:
        h.update(json.dumps(c.record(), sort_keys=True, ensure_ascii=False).encode())
    return h.hexdigest()


def _batches(chunks: list[Chunk], tokenizer, batch_size: int) -> list[list[int]]:
    """Chunk rows grouped by similar length (less padding), in a deterministic order."""
    lengths = [len(ids) for ids in tokenizer([c.text for c in chunks], add_special_tokens=True, verbose=False)["input_ids"]]
    order = sorted(range(len(chunks)), key=lambda i: (lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


Convert = Callable[[np.ndarray], np.ndarray]  # how a shard's memory rows become the bundle's


def _write_error(e: OSError, parent: Path) -> BundleError:
    """A full disk, a quota, a read-only or vanished folder: one message that names the place."""
    try:
        free = f"{shutil.disk_usage(parent).free:,} bytes free there"
    except OSError:
        free = "free space unknown"
    return BundleError(f"{e.filename or parent}: cannot write the bundle: {e.strerror or e} ({free}); "
                       "finished shards are kept, so rerunning the same command resumes")


def _captured(x: T | None, what: str, layer: int) -> T:
    """A PlainPass output that encode_batch asked the model pass for."""
    if x is None:
        raise RuntimeError(f"the model pass returned no {what} for the memory layer {layer}")
    return x


def encode_batch(encoder: Encoder, texts: list[str], starts: list[int], layer: int, cfg: BuildConfig) -> dict[str, np.ndarray]:
    """One model pass over one batch of chunk texts: embeddings, the document char spans of every
    memory token (`starts`: each chunk's first char in its document) and the memory (layer-`layer`
    K/V; or layer L's input states in float32 — quantised only in _assemble, which sees every batch —
    or nothing for `recompute`). Returns the arrays by name (each is written as NAME.npy). The same
    call runs here and on Ray workers (softknn/index_builder/distributed.py), which carry whatever it returns."""
    batch = encoder.tokenize(list(texts), truncate=True)
    hidden = cfg.memory.startswith("hidden")
    plain = encoder.forward_plain(batch, capture_layer=layer, keep_hidden=hidden)
    memory = ~batch.special  # (B, T) non-special, non-pad tokens are memory tokens
    keys, values, states, spans, counts = [], [], [], [], []
    for b, start in enumerate(starts):
        idx = memory[b].nonzero().flatten()
        if cfg.memory == "kv":
            keys.append(_captured(plain.key, "keys", layer)[b][:, idx].transpose(0, 1).cpu().numpy())  # (n, nh, hs)
            values.append(_captured(plain.value, "values", layer)[b][:, idx].transpose(0, 1).cpu().numpy())
        elif hidden:  # (n, C): layer L's input
            states.append(_captured(plain.hidden_states, "hidden states", layer)[layer][b, idx].float().cpu().numpy())
        spans.append(batch.offsets[b, idx].numpy().astype(np.int64) + start)  # doc char spans
        counts.append(len(idx))
    out = {"emb": plain.embedding.float().cpu().numpy(), "counts": np.asarray(counts, dtype=np.int64)}
    if cfg.memory == "kv":
        dtype = KV_DTYPES[cfg.kv_dtype]
        out["keys"], out["values"] = np.concatenate(keys).astype(dtype), np.concatenate(values).astype(dtype)
    elif hidden:
        out["hidden"] = np.concatenate(states).astype(np.float32)
    out["spans"] = np.concatenate(spans)
    return out


def calibrate_generator(tmp: Path, texts: list[str], xb: np.ndarray, lex, manifest: dict, gen: Generator,
                        embed: Callable[[list[str]], np.ndarray], *, progress: bool = False, decode: bool = True) -> dict:
    """The manifest's `generator.calibration`: k and β by softknn.generate.calibration over the bundle being
    written in `tmp` (its generator memory, its retrieval as a request would resolve it: mode, λ and τ of
    the bundle's own calibration), when `decode`; and always the refusal threshold (`refusal`:
    softknn.generate.refusal, retrieval alone, no decoding)."""
    from softknn.generate.calibration import answers_with_memory, calibrate_generation
    from softknn.generate.memory import GeneratorStore
    from softknn.generate.refusal import calibrate_refusal

    t0 = time.perf_counter()
    refusal = {**calibrate_refusal(xb, texts, embed), "seconds": round(time.perf_counter() - t0, 1)}
    if not decode:
        return {"refusal": refusal}

    rec = manifest["generator"]
    store = GeneratorStore(tmp, rec, len(texts))
    layers, prefix = list(rec["layers"]), list(rec.get("prefix") or [])
    p = InferParams().resolved(lex is not None, (manifest.get("calibration") or {}).get("retrieval_defaults"))

    def recompute(rows: list[int]):
        from softknn.generate.memory import ChunkKV

        kv = gen.chunk_kv([store.token_ids(r) for r in rows], layers, prefix=prefix)
        return [ChunkKV(torch.from_numpy(x)) for x in kv]

    t0 = time.perf_counter()
    rec = calibrate_generation(texts, xb, embed, lex if p.retrieval != "dense" else None,
                               lambda batch: answers_with_memory(gen, layers, store, recompute, batch, progress=progress),
                               lexical_weight=p.lexical_weight, temperature=p.temperature, kernel=p.kernel,
                               candidates=CANDIDATES)
    gen.close_loops()  # the calibration's decode loop and its cache: a server opens its own
    return {**rec, "seconds": round(time.perf_counter() - t0, 1), "refusal": refusal}


def embed_texts(encoder: Encoder, texts: list[str], batch_size: int = 32) -> np.ndarray:
    """e (n, D) float32 of texts as the service embeds an input (truncated), batched by length."""
    out = np.zeros((len(texts), encoder.info.dim), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        out[rows] = encoder.forward_plain(encoder.tokenize([texts[i] for i in rows], truncate=True)).embedding.float().cpu().numpy()
    return out


def write_shard(shard: Path, rows: list[int], arrays: dict[str, np.ndarray]) -> None:
    """One encoded batch (encode_batch's arrays) as a shard directory, renamed into place whole."""
    tmp = shard.with_name(f"{shard.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    save_array(tmp / "rows.npy", np.asarray(rows, dtype=np.int64))
    for name, array in arrays.items():
        save_array(tmp / f"{name}.npy", array)
    os.replace(tmp, shard)  # a shard exists whole or not at all


def _encode_shard(encoder: Encoder, chunks: list[Chunk], rows: list[int], layer: int, cfg: BuildConfig, shard: Path) -> None:
    arrays = encode_batch(encoder, [chunks[r].text for r in rows], [chunks[r].start for r in rows], layer, cfg)
    write_shard(shard, rows, arrays)


def _picks_from_rows(batches: list[Path], n: int) -> list[tuple[int, int]]:
    """row -> (batch, position in it), from each batch's rows.npy (a build's own work folder)."""
    picks: list[tuple[int, int]] = [(-1, -1)] * n
    for i, sh in enumerate(batches):
        for b, r in enumerate(np.load(sh / "rows.npy").tolist()):
            picks[r] = (i, b)
    return picks


class _MemoryWriter:
    """Writes the memory files (the bundle's names) of a range of chunk rows from the encoded
    batches: the whole KB into a one-index bundle, or each shard's rows straight into its folder
    (no whole-KB copy first). hidden-int8's per-channel scale is the whole KB's, from every row."""

    def __init__(self, batches: list[Path], by_batch: list[list[tuple[int, int]]], firsts: list[np.ndarray],
                 counts: np.ndarray, start: np.ndarray, kind: str, dtype, nh: int, hs: int):
        self.batches, self.by_batch, self.firsts = batches, by_batch, firsts
        self.counts, self.start, self.kind = counts, start, kind
        # name in the batch -> (name in the bundle, dtype, row shape, how a batch's rows are converted)
        self.files: dict[str, tuple[str, object, tuple[int, ...], Convert | None]] = {}
        self.scale: np.ndarray | None = None
        if kind == "kv":
            self.files["keys.npy"] = ("kv_keys.npy", dtype, (nh, hs), None)
            self.files["values.npy"] = ("kv_values.npy", dtype, (nh, hs), None)
        elif kind != "recompute":
            convert: Convert | None = None
            if kind == "hidden-int8":  # one scale per channel needs the max over every row first
                absmax = np.zeros(nh * hs, dtype=np.float32)
                for i, sh in enumerate(batches):
                    h = np.load(sh / "hidden.npy", mmap_mode="r")
                    for r, b in by_batch[i]:
                        f, c = firsts[i][b], counts[r]
                        if c:
                            absmax = np.maximum(absmax, np.abs(h[f : f + c]).max(0))
                scale = self.scale = int8_scale(absmax)
                convert = lambda x: quantize_int8(np.asarray(x), scale)  # noqa: E731
            self.files["hidden.npy"] = ("mem_hidden.npy", HIDDEN_DTYPES[kind], (nh * hs,), convert)

    def write(self, dst: Path, lo: int, hi: int) -> None:
        """The memory of rows [lo, hi) as dst/<name>.npy, token 0 being row lo's first."""
        if not self.files:
            return
        t0 = int(self.start[lo])
        t1 = int(self.start[hi - 1] + self.counts[hi - 1])
        out = {name: allocated_memmap(dst / final, dt, (t1 - t0, *shape)) for name, (final, dt, shape, _) in self.files.items()}
        for i, sh in enumerate(self.batches):
            rows = [(r, b) for r, b in self.by_batch[i] if lo <= r < hi]
            if not rows:
                continue
            src = {name: np.load(sh / name, mmap_mode="r") for name in self.files}
            for r, b in rows:
                f, c, d = self.firsts[i][b], self.counts[r], self.start[r] - t0
                for name, (_, _, _, convert) in self.files.items():
                    x = src[name][f : f + c]
                    out[name][d : d + c] = convert(x) if convert else x
            del src
        for arr in out.values():
            arr.flush()
        del out


def _assemble(batches: list[Path], picks: list[tuple[int, int]], chunks: list[Chunk], nh: int, hs: int, dim: int,
              dtype, tmp: Path, memory_kind: str = "kv", *, with_memory: bool = True) -> tuple[int, _MemoryWriter]:
    """Concatenate the encoded batches into chunk order: embeddings, spans, chunk token ranges and
    (`with_memory`) the memory; returns (the number of memory tokens, the memory's writer, which
    writes the memory of any row range: a sharded build writes each shard's with it).

    `picks[r]`: the batch and position in it that hold chunk row r's encoding. A batch that records the
    first char its chunks had (starts.npy: the encode cache's) has its spans shifted to the chunk's place."""
    n = len(chunks)
    cnts = [np.load(sh / "counts.npy") for sh in batches]
    firsts = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64) for c in cnts]
    olds = [np.load(sh / "starts.npy") if (sh / "starts.npy").is_file() else None for sh in batches]
    counts = np.asarray([cnts[i][b] for i, b in picks], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    ntok = int(counts.sum())
    by_batch: list[list[tuple[int, int]]] = [[] for _ in batches]  # batch -> [(row, position)], rows ascending
    for r, (i, b) in enumerate(picks):
        by_batch[i].append((r, b))
    emb = allocated_memmap(tmp / "embeddings.npy", np.float32, (n, dim))
    spans = allocated_memmap(tmp / "token_spans.npy", np.int64, (ntok, 2))
    for i, sh in enumerate(batches):
        if not by_batch[i]:
            continue
        e, sp = (np.load(sh / f, mmap_mode="r") for f in ("emb.npy", "spans.npy"))
        old = olds[i]
        for r, b in by_batch[i]:
            f, c, dst = firsts[i][b], counts[r], start[r]
            emb[r] = e[b]
            shift = 0 if old is None else chunks[r].start - int(old[b])
            spans[dst : dst + c] = sp[f : f + c] + shift if shift else sp[f : f + c]
        del e, sp
    for arr in (emb, spans):
        arr.flush()
    del emb, spans
    save_array(tmp / "chunk_tokens.npy", np.stack([start, counts], axis=1))
    writer = _MemoryWriter(batches, by_batch, firsts, counts, start, memory_kind, dtype, nh, hs)
    if writer.scale is not None:
        save_array(tmp / "mem_hidden_scale.npy", writer.scale)
    if with_memory:
        writer.write(tmp, 0, n)
    return ntok, writer


def build_bundle(
    kb: Path, out: Path, cfg: BuildConfig, encoder: Encoder, *, force: bool = False, progress: bool = True,
    encode: EncodeStrategy | None = None, generator: Generator | None = None, cache: Path | None = None,
    stats: dict | None = None,
) -> dict:
    """Build the bundle for KB `kb` at `out`; returns its manifest. With a causal LM `generator`, its
    keys/values of every chunk are stored too (softknn.index_builder.generator_memory).

    `encode`: where the model passes run. None: here, batch after batch. A strategy (e.g.
    softknn.index_builder.distributed.RayEncode) gets the same batches and returns the same arrays; the
    shards, and so the bundle, are written here either way, byte for byte the same.

    `cache`: an encode cache folder (softknn.index_builder.encode_cache): only chunks whose text it does
    not hold are encoded, and the encoded batches stay there for the next build. `stats` (a dict) is
    filled with the chunk counts: encoded, reused."""
    kb, out = Path(kb), Path(out)
    if out.exists() and not force:
        raise BundleError(f"{out}: already exists; pass --force to replace it")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"{parent}: cannot create the output folder: {e.strerror or e}") from e
    if not os.access(parent, os.W_OK):
        raise BundleError(f"{parent}: output folder is not writable")
    layer = encoder.check_layer(cfg.layer)
    if cfg.memory.startswith("hidden"):
        encoder.check_project_kv(layer)  # the stored states are useless without the layer's key/value Linear
    chunk_tokens = cfg.chunk_tokens or encoder.max_seq_length - 8
    cfg = BuildConfig(**{**asdict(cfg), "chunk_tokens": chunk_tokens, "fields": cfg.fields})
    if cfg.kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}")
    if cfg.shards < 1:
        raise ValueError(f"shards must be ≥ 1, got {cfg.shards}")
    check_kind(cfg.memory)
    check_kv_dtype(cfg.memory, cfg.kv_dtype)
    docs = read_kb(kb, cfg.fields)
    chunks = chunk_documents(docs, encoder.tokenizer, chunk_tokens, cfg.overlap)
    if not chunks:
        raise KBFormatError(f"{kb}: no chunks")
    if cfg.shards > len(chunks):
        raise ValueError(f"shards ({cfg.shards}) must not exceed the KB's {len(chunks)} chunks")
    gen_spec, gen_plan = None, None
    if generator is not None:
        if cfg.shards > 1:
            raise ValueError("generator memory is not sharded: build it with --shards 1")
        gen_spec = GeneratorBuild(cfg.generator_layers, cfg.generator_memory, cfg.generator_keep).check()
        generator.layers(gen_spec.layers)  # a bad layer list is refused before any work
        gen_plan = plan_record(generator, gen_spec)
    plan = _plan_hash(chunks, cfg, encoder, layer, gen_plan)
    try:
        gen = (generator, gen_spec) if generator else None
        if cache is None:
            return _build(chunks, docs, kb, out, parent, cfg, encoder, layer, plan, force=force, progress=progress,
                          encode=encode, generator=gen, stats=stats)
        from softknn.index_builder.encode_cache import EncodeCache

        info = encoder.info
        ec = EncodeCache(cache, fingerprint=info.fingerprint, precision=info.precision, layer=layer,
                         memory=cfg.memory, kv_dtype=cfg.kv_dtype)
        with ec.locked():
            return _build(chunks, docs, kb, out, parent, cfg, encoder, layer, plan, force=force, progress=progress,
                          encode=encode, generator=gen, stats=stats, cache=ec)
    except OSError as e:
        raise _write_error(e, parent) from e


def _build(chunks, docs, kb, out, parent, cfg, encoder, layer, plan, *, force, progress, encode=None,
           generator=None, stats=None, cache=None) -> dict:
    """The writing half of build_bundle: shards (resumed), then the bundle, assembled and renamed in."""
    for stale in parent.glob(f".{out.name}.tmp-*"):  # a killed run's half-assembled bundle: never loadable, only space
        shutil.rmtree(stale, ignore_errors=True)
    work = parent / f".{out.name}.partial"
    if (work / "plan.txt").is_file() and (work / "plan.txt").read_text() != plan:
        log.info("discarding %s: it was started for other input or settings", work)
        shutil.rmtree(work)
    work.mkdir(exist_ok=True)
    atomic_write_bytes(work / "plan.txt", plan.encode())
    for stale in work.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)

    dtype = KV_DTYPES[cfg.kv_dtype]
    if cache is None:
        sources, picks, encoded = _encode_here(work, chunks, cfg, encoder, layer, progress, encode)
    else:
        sources, picks, encoded = _encode_cached(cache, chunks, cfg, encoder, layer, progress, encode)
    if stats is not None:
        stats.update(chunks=len(chunks), encoded=encoded, reused=len(chunks) - encoded)
    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        info = encoder.info
        sharded = cfg.shards > 1  # each shard's memory and FAISS index are written into its folder (write_shards)
        ntok, memory = _assemble(sources, picks, chunks, info.num_heads, info.head_dim, info.dim, dtype, tmp,
                                 cfg.memory, with_memory=not sharded)
        xb = np.load(tmp / "embeddings.npy")
        spec = choose_index(len(chunks), info.dim, cfg.index_type, cfg.index_params)
        if not sharded:
            # serialize + Python write, not faiss.write_index: a full disk then raises OSError with errno
            # (same bytes; faiss's own writer fails with a RuntimeError that names no cause)
            (tmp / "index.faiss").write_bytes(faiss.serialize_index(build_index(xb, spec)).tobytes())
        with open(tmp / "chunks.jsonl", "w", encoding="utf-8") as f:
            for c in chunks:
                f.write(json.dumps(c.record(), sort_keys=True, ensure_ascii=False) + "\n")
        manifest = _manifest(kb, cfg, encoder, layer, spec, docs, chunks, ntok, plan)
        texts = [c.text for c in chunks]
        lex = None
        if cfg.lexical:
            manifest["lexical"], lex = write_lexical(texts, tmp)
        if cfg.calibrate and manifest["labels"]:
            manifest["calibration"] = calibrate_loo(xb, [c.label for c in chunks], texts, lex,
                                                    k=InferParams().k, candidates=CANDIDATES)
        elif cfg.calibrate and lex is not None:  # unlabelled: λ from held-out sentences of its own chunks
            manifest["calibration"] = calibrate_unlabelled(xb, texts, lex.spec, lambda t: embed_texts(encoder, t, cfg.batch_size),
                                                           candidates=CANDIDATES)
        if generator is not None:
            gen, spec = generator
            manifest["generator"] = write_generator_memory(tmp, texts, gen, spec, work, progress=progress)
            if cfg.calibrate:
                manifest["generator"]["calibration"] = calibrate_generator(
                    tmp, texts, xb, lex, manifest, gen, lambda t: embed_texts(encoder, t, cfg.batch_size),
                    progress=progress, decode=cfg.generator_calibrate)
        if cfg.shards > 1:  # the one-index files above, split into shards (calibration stays global)
            manifest = _finalize_sharded(tmp, out, parent, manifest, lex, cfg.shards, force=force,
                                         write_memory=memory.write)
        else:
            manifest = finalize(tmp, out, manifest, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    if cache is not None:
        removed = cache.prune({chunk_key(c.text) for c in chunks})
        if stats is not None:
            stats.update(cache_batches_removed=removed, cache_batches_damaged=cache.removed)
    return manifest


def _encode_here(work: Path, chunks: list[Chunk], cfg: BuildConfig, encoder: Encoder, layer: int, progress: bool,
                 encode: EncodeStrategy | None) -> tuple[list[Path], list[tuple[int, int]], int]:
    """Every chunk encoded into this build's work folder (finished batches of a killed run kept):
    (the batches, row -> (batch, position), chunks encoded by this run)."""
    batches = _batches(chunks, encoder.tokenizer, cfg.batch_size)
    todo = [s for s in range(len(batches)) if not (work / f"shard-{s:06d}").is_dir()]
    done = len(chunks) - sum(len(batches[s]) for s in todo)
    bar = tqdm(total=len(chunks), desc="encoding", unit="chunk", disable=not progress, initial=done)
    if encode is None:
        for s in todo:
            _encode_shard(encoder, chunks, batches[s], layer, cfg, work / f"shard-{s:06d}")
            bar.update(len(batches[s]))
    else:  # the batches elsewhere, in any order; each shard written here as its arrays arrive
        for s, arrays in encode(encoder, chunks, [(s, batches[s]) for s in todo], layer, cfg):
            write_shard(work / f"shard-{s:06d}", batches[s], arrays)
            bar.update(len(batches[s]))
    bar.close()
    sources = [work / f"shard-{s:06d}" for s in range(len(batches))]
    return sources, _picks_from_rows(sources, len(chunks)), len(chunks) - done


def _encode_cached(cache, chunks: list[Chunk], cfg: BuildConfig, encoder: Encoder, layer: int, progress: bool,
                   encode: EncodeStrategy | None) -> tuple[list[Path], list[tuple[int, int]], int]:
    """Only the chunks whose text `cache` (an EncodeCache, locked) lacks are encoded, once per distinct
    text, in the builder's batches; each batch is kept in the cache. Same return as _encode_here."""
    keys = [chunk_key(c.text) for c in chunks]
    cache.verify(keys)  # the batches this build would read, each file against its sha256
    first: dict[bytes, int] = {}
    for r, k in enumerate(keys):
        if k not in cache.known:
            first.setdefault(k, r)
    rows = list(first.values())
    batches = [[rows[i] for i in b] for b in _batches([chunks[r] for r in rows], encoder.tokenizer, cfg.batch_size)] \
        if rows else []
    bar = tqdm(total=len(rows), desc="encoding (new chunks)", unit="chunk", disable=not progress)

    def keep(batch: list[int], arrays: dict[str, np.ndarray]) -> None:
        cache.write([keys[r] for r in batch], [chunks[r].start for r in batch], arrays)
        bar.update(len(batch))

    if encode is None:
        for batch in batches:
            keep(batch, encode_batch(encoder, [chunks[r].text for r in batch], [chunks[r].start for r in batch],
                                     layer, cfg))
    else:
        for s, arrays in encode(encoder, chunks, list(enumerate(batches)), layer, cfg):
            keep(batches[s], arrays)
    bar.close()
    picks = [cache.known[k] for k in keys]
    used = sorted({i for i, _ in picks})  # the batches this build reads (a removed one is never among them)
    where = {i: j for j, i in enumerate(used)}
    return [cache.batches[i] for i in used], [(where[i], b) for i, b in picks], len(rows)


def _finalize_sharded(full: Path, out: Path, parent: Path, manifest: dict, lex, n_shards: int, *, force: bool,
                      write_memory=None) -> dict:
    from softknn.index_builder.sharding import finalize_sharded, write_shards

    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        top = write_shards(full, tmp, manifest, lex, n_shards, write_memory=write_memory)
        result = finalize_sharded(tmp, out, top, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(full, ignore_errors=True)
    return result


def write_lexical(texts: list[str], bundle_dir: Path, spec: LexicalSpec = LexicalSpec()) -> tuple[dict, LexicalIndex]:
    """The BM25 index of the chunk texts under bundle_dir/lexical/; (its manifest entry, the index)."""
    lex = LexicalIndex.build(texts, spec)
    lex.save(bundle_dir)
    entry = {"settings": spec.to_manifest(), "vocabulary": len(lex.vocab), "postings": int(lex.retriever.scores["indptr"][-1])}
    return entry, lex


def read_chunks(bundle: Path) -> list[dict]:
    with open(Path(bundle) / "chunks.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def add_lexical(bundle: Path, encoder: Encoder | None = None, batch_size: int = 32) -> dict:
    """Give a bundle built without a lexical index one, without re-encoding the chunks: the new
    bundle is assembled beside it (the other files hard-linked, or copied across file systems),
    checksummed and renamed over it, so a crash leaves the old bundle or the new one. Returns the
    manifest. The default retrieval becomes hybrid, so its λ is chosen anew as a build chooses it:
    a labelled KB by leave-one-out over its chunks; an unlabelled one from pseudo-queries, which
    `encoder` (the bundle's model) embeds; without one, an unlabelled KB keeps the fixed λ."""
    bundle = Path(bundle)
    manifest = verify_bundle(bundle)
    if manifest.get("lexical"):
        raise BundleError(f"{bundle}: already has a lexical index")
    texts = [c["text"] for c in read_chunks(bundle)]
    tmp = bundle.parent / f".{bundle.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name in data_files(manifest.get("memory", "kv"), lexical=False):
            try:
                os.link(bundle / name, tmp / name)
            except OSError:
                shutil.copy2(bundle / name, tmp / name)
        new = {k: v for k, v in manifest.items() if k not in ("files", "version_id", "created_at")}
        new["lexical"], lex = write_lexical(texts, tmp)
        if new.get("labels"):  # the default retrieval becomes hybrid: choose its λ, τ and abstain rule anew
            labels = [c.get("label") for c in read_chunks(bundle)]
            new["calibration"] = calibrate_loo(np.load(bundle / "embeddings.npy"), labels, texts, lex,
                                               k=InferParams().k, candidates=CANDIDATES)
        elif encoder is not None:
            if encoder.info.fingerprint != manifest["model"]["fingerprint"]:
                raise BundleError(f"{bundle}: built with model {manifest['model']['name']!r} "
                                  f"(fingerprint {manifest['model']['fingerprint'][:12]}), not {encoder.info.name!r} "
                                  f"({encoder.info.fingerprint[:12]}): its pseudo-queries need the bundle's model")
            new["calibration"] = calibrate_unlabelled(np.load(bundle / "embeddings.npy"), texts, lex.spec,
                                                      lambda t: embed_texts(encoder, t, batch_size), candidates=CANDIDATES)
        return finalize(tmp, bundle, new, force=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _manifest(kb, cfg, encoder, layer, spec, docs, chunks, ntok, plan) -> dict:
    labels: dict[str, int] = {}
    for c in chunks:
        if c.label is not None:
            labels[c.label] = labels.get(c.label, 0) + 1
    info = encoder.info
    return {
        "model": {
            "name": info.name,
            "fingerprint": info.fingerprint,
            "num_layers": info.num_layers,
            "num_heads": info.num_heads,
            "head_dim": info.head_dim,
            "dim": info.dim,
            "max_seq_length": info.max_seq_length,
            "runtime": info.runtime,  # what computed the K/V and embeddings
            "precision": info.precision,  # served only with the same numerics (Engine)
        },
        "memory_layer": layer,
        "index": {"kind": spec.kind, "params": spec.params, "reason": spec.reason},
        "kv_dtype": cfg.kv_dtype,
        "memory": cfg.memory,
        "counts": {"docs": len(docs), "chunks": len(chunks), "tokens": ntok, "labelled_chunks": sum(labels.values())},
        "labels": sorted(labels),
        "label_counts": dict(sorted(labels.items())),
        "build": {
            "source": Path(kb).name,
            "input_sha256": plan,
            "chunk_tokens": cfg.chunk_tokens,
            "overlap": cfg.overlap,
            "batch_size": cfg.batch_size,
            "fields": asdict(cfg.fields),
        },
        "calibration": {"abstain_threshold": None},
    }
