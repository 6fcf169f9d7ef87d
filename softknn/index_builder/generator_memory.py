"""The builder's generator pass: every chunk through the causal LM on its own, after the memory
prefix, its keys/values at the memory layers stored in the chosen representation (softknn.gen_memory).

Resumable like the encoder pass: each batch of chunks is written to the build's work folder under a
temporary name and renamed when whole, and a rerun skips the batches already there.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from softknn.gen_memory import GEN_DIR, GEN_MEMORY_KINDS, quantize
from softknn.generator import Generator

BATCH = 16  # chunks per resumable unit of the generator pass


@dataclass(frozen=True)
class GeneratorBuild:
    layers: str = "all"  # "all" or "a,b,c" (0-based; negative from the last)
    memory: str = "fp16"  # softknn.gen_memory.GEN_MEMORY_KINDS

    def check(self) -> GeneratorBuild:
        if self.memory not in GEN_MEMORY_KINDS:
            raise ValueError(f"generator memory must be one of {GEN_MEMORY_KINDS}, not {self.memory!r}")
        return self


def plan_record(gen: Generator, spec: GeneratorBuild) -> dict:
    """What the generator pass depends on (part of the build's plan hash: no resume across changes)."""
    return {"fingerprint": gen.info.fingerprint, "layers": gen.layers(spec.layers), "memory": spec.memory,
            "prefix": gen.memory_prefix()}


def _write_batch(work: Path, b: int, kv: list[np.ndarray], kind: str) -> None:
    final = work / f"gen-{b:06d}"
    tmp = work / f"gen-{b:06d}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    if kind != "recompute":
        q, scale = quantize(np.concatenate(kv), kind)
        np.save(tmp / "kv.npy", q)
        if scale is not None:
            np.save(tmp / "kv_scale.npy", scale)
    (tmp / "done").write_text("ok")
    tmp.rename(final)


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
    bar = tqdm(total=len(ids), desc="generator memory", unit="chunk", disable=not progress,
               initial=len(ids) - sum(len(batches[b]) for b in todo))
    for b in todo:
        kv = [] if spec.memory == "recompute" else gen.chunk_kv([ids[i] for i in batches[b]], layers, prefix=prefix)
        _write_batch(work, b, kv, spec.memory)
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
        names = ["kv.npy"] + (["kv_scale.npy"] if spec.memory == "int8" else [])
        for name in names:
            parts = [np.load(work / f"gen-{b:06d}" / name, mmap_mode="r") for b in range(len(batches))]
            arr = np.lib.format.open_memmap(d / name, mode="w+", dtype=parts[0].dtype, shape=(n_tok, *parts[0].shape[1:]))
            o = 0
            for p in parts:
                arr[o : o + len(p)] = p
                o += len(p)
            arr.flush()
            del arr
            nbytes += (d / name).stat().st_size
    info = gen.info
    return {**info.record(), "layers": layers, "memory": spec.memory, "prefix": prefix, "tokens": n_tok,
            "bytes_per_chunk": round(nbytes / max(len(ids), 1), 1)}
