"""The builder's generator pass: every chunk through the causal LM on its own, after the memory
prefix, its keys/values at the memory layers stored in the chosen representation (softknn.generate.memory),
of every token or of the tokens the chunk's own attention keeps (`keep` < 1).

Resumable like the encoder pass: each batch of chunks is written to the build's work folder under a
temporary name and renamed when whole, and a rerun skips the batches already there.
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from softknn.generate.memory import bytes_per_token, encode_chunk, select_tokens
from softknn.generate.model import Generator
from softknn.storage.layout import BITS, GEN_DIR, GEN_MEMORY_KINDS

BATCH = 16  # chunks per resumable unit of the generator pass


@dataclass(frozen=True)
class GeneratorBuild:
    layers: str = "all"  # "all" or "a,b,c" (0-based; negative from the last)
    # softknn.storage.layout.GEN_MEMORY_KINDS; q4 (KIVI 4-bit) answered as fp16 did on the sample QA test
    # split at 28% of its bytes (docs/generation.md, "Memory representations")
    memory: str = "q4"
    keep: float = 1.0  # fraction of each chunk's tokens stored (softknn.generate.memory.select_tokens)

    def check(self) -> GeneratorBuild:
        if self.memory not in GEN_MEMORY_KINDS:
            raise ValueError(f"generator memory must be one of {GEN_MEMORY_KINDS}, not {self.memory!r}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"generator keep must be in (0, 1], not {self.keep}")
        return self

    @property
    def selects(self) -> bool:
        return self.keep < 1.0 and self.memory != "recompute"


def plan_record(gen: Generator, spec: GeneratorBuild) -> dict:
    """What the generator pass depends on (part of the build's plan hash: no resume across changes)."""
    rec: dict[str, object] = {"fingerprint": gen.info.fingerprint, "layers": gen.layers(spec.layers), "memory": spec.memory,
           "prefix": gen.memory_prefix()}
    if spec.keep < 1.0:
        rec["keep"] = spec.keep
    return rec


def _write_batch(work: Path, b: int, arrays: dict[str, np.ndarray]) -> None:
    final = work / f"gen-{b:06d}"
    tmp = work / f"gen-{b:06d}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for name, a in arrays.items():
        np.save(tmp / f"{name}.npy", a)
    (tmp / "done").write_text("ok")
    tmp.rename(final)


def _encode_batch(gen: Generator, ids: list[list[int]], layers: list[int], prefix: list[int],
                  spec: GeneratorBuild) -> dict[str, np.ndarray]:
    """One batch of chunks → its stored arrays, rows in chunk order (token rows, then chunk rows)."""
    if spec.memory == "recompute":
        return {}
    votes: list[np.ndarray] | None = [] if spec.selects else None
    kvs = gen.chunk_kv(ids, layers, prefix=prefix, votes=votes)
    parts: dict[str, list[np.ndarray]] = {}
    for c, kv in enumerate(kvs):
        kept = select_tokens(votes[c], spec.keep) if votes is not None else None
        enc = encode_chunk(kv[kept] if kept is not None else kv, spec.memory)
        if kept is not None:
            enc["kept"] = kept.astype(np.int32)
            enc["counts"] = np.array([len(kept)], dtype=np.int64)
        for name, a in enc.items():
            parts.setdefault(name, []).append(a)
    return {name: np.concatenate(p) for name, p in parts.items()}


def write_generator_memory(out: Path, texts: list[str], gen: Generator, spec: GeneratorBuild, work: Path,
                           *, progress: bool = True) -> dict:
    """Write out/generator/* for the chunk texts; returns the manifest's `generator` section."""
    spec = spec.check()
    layers = gen.layers(spec.layers)
    prefix = gen.memory_prefix()
    ids = [gen.memory_ids(t) for t in texts]
    batches = [list(range(i, min(i + BATCH, len(ids)))) for i in range(0, len(ids), BATCH)]
    for stale in work.glob("gen-*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    todo = [b for b in range(len(batches)) if not (work / f"gen-{b:06d}" / "done").is_file()]
    t0 = time.perf_counter()
    bar = tqdm(total=len(ids), desc="generator memory", unit="chunk", disable=not progress,
               initial=len(ids) - sum(len(batches[b]) for b in todo))
    for b in todo:
        _write_batch(work, b, _encode_batch(gen, [ids[i] for i in batches[b]], layers, prefix, spec))
        bar.update(len(batches[b]))
    bar.close()
    d = out / GEN_DIR
    d.mkdir()
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    np.save(d / "tokens.npy", np.array([t for x in ids for t in x], dtype=np.int32))
    np.save(d / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    n_tok = int(lengths.sum())
    nbytes = 0
    if spec.memory != "recompute":
        names = ["kv"] + (["kv_scale"] if spec.memory == "int8" else []) + (["k_range", "v_range"]
                                                                            if spec.memory in BITS else [])
        if spec.selects:
            names.append("kept")
            counts = np.concatenate([np.load(work / f"gen-{b:06d}" / "counts.npy") for b in range(len(batches))])
            np.save(d / "kv_offsets.npy", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
            nbytes += (d / "kv_offsets.npy").stat().st_size
        for name in names:
            nbytes += _concatenate(d / f"{name}.npy", [work / f"gen-{b:06d}" / f"{name}.npy" for b in range(len(batches))])
    info = gen.info
    rows = int(np.load(d / "kv.npy", mmap_mode="r").shape[0]) if spec.memory != "recompute" else 0
    formula = bytes_per_token(spec.memory, len(layers), info.num_kv_heads, info.head_dim, n_tok / max(len(ids), 1),
                              rows / max(n_tok, 1), spec.selects)
    rec = {**info.record(), "layers": layers, "memory": spec.memory, "prefix": prefix, "tokens": n_tok,
           "bytes_per_chunk": round(nbytes / max(len(ids), 1), 1),
           "bytes_per_token": round(nbytes / max(n_tok, 1), 1), "bytes_per_token_formula": round(formula, 1),
           "seconds": round(time.perf_counter() - t0, 1)}
    if spec.keep < 1.0:
        rec["keep"] = spec.keep
    return rec


def _concatenate(dst: Path, parts: list[Path]) -> int:
    """The row-wise concatenation of the .npy files `parts` into dst (memory-mapped, no whole copy in
    RAM); its size in bytes."""
    arrays = [np.load(p, mmap_mode="r") for p in parts]
    n = sum(len(a) for a in arrays)
    out = np.lib.format.open_memmap(dst, mode="w+", dtype=arrays[0].dtype, shape=(n, *arrays[0].shape[1:]))
    o = 0
    for a in arrays:
        out[o : o + len(a)] = a
        o += len(a)
    out.flush()
    del out
    return dst.stat().st_size
