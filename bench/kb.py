"""KBs for the performance benchmarks: one real bundle, real embeddings, and larger KBs made from them.

    python -m bench kb [--real 10000]        # prepare (cached under $SOFTKNN_BENCH_CACHE, /tmp/softknn-bench)

What is real and what is synthetic (docs/benchmarks.md repeats this):
- texts: sentence-level pieces of the ObliQA passages (../shared/data/obliqa_dev/documents, split at
  . ! ? ; and newlines, ≥ 5 words) plus the Banking77 train texts — ~46k real texts.
- the real bundle: `softknn build` (softknn.index_builder.build_bundle) of `--real` of those texts, shuffled
  with a fixed seed: real embeddings, real layer-L K/V, real provenance.
- the embedding pool: real all-MiniLM-L6-v2 embeddings of *every* text (the bundle's rows first).
- a KB of N chunks (`synthetic_bundle(N)`): rows < N_bundle are the real bundle; rows up to the
  pool size are real embeddings of the other texts; rows beyond are replicas of pool rows plus
  Gaussian noise (σ per dimension, default 0.02), renormalised. Every row beyond the real bundle
  borrows the K/V, token spans and text of real bundle chunk (row mod N_bundle): its K/V are real
  tensors, but not those of the text its embedding came from. The K/V store is not copied: the
  synthetic rows point at the real rows, so K/V memory stays the real bundle's size.
Queries: real ObliQA questions and Banking77 test texts (never in the KB).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CACHE = Path(os.environ.get("SOFTKNN_BENCH_CACHE", "/tmp/softknn-bench"))
SEED = 1234
NOISE = 0.02
SEARCH_PARAMS = ("efSearch", "nprobe", "rerank")  # set at search time: not part of a cached index's key


def set_threads(n: int) -> None:
    """torch and faiss intra-op threads for this process (0 = leave their defaults)."""
    import faiss
    import torch

    if n:
        torch.set_num_threads(n)
        faiss.omp_set_num_threads(n)


def device() -> str:
    """cuda when torch sees one (bench/gpu.sh), else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def kb_texts() -> list[dict]:
    """ObliQA sentences and Banking77 train texts, shuffled with a fixed seed: [{id, text, label?}]."""
    recs = []
    for p in sorted((SHARED / "obliqa_dev" / "documents").glob("*.json"), key=lambda p: int(p.stem)):
        for r in json.loads(p.read_text()):
            for j, s in enumerate(re.split(r"(?<=[.!?;])\s+|\n+", r["Passage"])):
                s = s.strip()
                if len(s.split()) >= 5:
                    recs.append({"id": f"obliqa:{r['ID']}:s{j}", "text": s})
    with open(SHARED / "banking77" / "train.csv", newline="", encoding="utf-8") as f:
        recs += [{"id": f"b77:{i}", "text": r["text"], "label": r["category"]} for i, r in enumerate(csv.DictReader(f))]
    random.Random(SEED).shuffle(recs)
    return recs


def queries(n: int = 200) -> list[str]:
    """n real queries: half ObliQA questions, half Banking77 test texts (fixed order)."""
    qs = [q["Question"] for q in json.loads((SHARED / "obliqa_dev" / "questions.json").read_text())]
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        b = [r["text"] for r in csv.DictReader(f)]
    rng = random.Random(SEED)
    rng.shuffle(qs)
    rng.shuffle(b)
    out = [x for pair in zip(qs, b) for x in pair]
    return out[:n]


def bundle_path(n_real: int) -> Path:
    return CACHE / f"real-{n_real}"


def prepare(n_real: int = 10_000, batch_size: int = 64) -> dict:
    """Build the real bundle and encode the embedding pool (both cached). Returns timings."""
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.model.encoder import Encoder

    CACHE.mkdir(parents=True, exist_ok=True)
    recs = kb_texts()
    enc = Encoder(device=device())
    out = {"texts": len(recs)}
    bp = bundle_path(n_real)
    if not (bp / "manifest.json").is_file():
        kb = CACHE / f"kb-{n_real}.jsonl"
        kb.write_text("".join(json.dumps(r) + "\n" for r in recs[:n_real]))
        t0 = time.perf_counter()
        build_bundle(kb, bp, BuildConfig(batch_size=batch_size, index_type="flat", memory="kv"), enc, force=True,
                     progress=False)  # kv: synthetic_bundle tiles its KVStore
        out["build_s"] = time.perf_counter() - t0
    pool = CACHE / "pool.npy"
    if not pool.is_file():
        xb = np.load(bp / "embeddings.npy")
        rest = [r["text"] for r in recs[len(xb):]]
        t0 = time.perf_counter()
        xr = enc.st.encode(rest, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True)
        out["encode_pool_s"] = time.perf_counter() - t0
        np.save(pool, np.concatenate([xb, xr.astype(np.float32)]))
    qp = CACHE / "queries.npy"
    if not qp.is_file():
        np.save(qp, enc.st.encode(queries(), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True))
    return out


def embeddings(n: int, noise: float = NOISE) -> np.ndarray:
    """(n, D) float32 unit rows: the real pool, then noisy replicas of it (see the module docstring)."""
    pool = np.load(CACHE / "pool.npy", mmap_mode="r")
    if n <= len(pool):
        return np.ascontiguousarray(pool[:n], dtype=np.float32)
    xb = np.empty((n, pool.shape[1]), dtype=np.float32)
    xb[: len(pool)] = pool
    rng = np.random.default_rng(SEED)
    step = 1 << 17
    for s in range(len(pool), n, step):
        e = min(n, s + step)
        x = pool[np.arange(s, e) % len(pool)] + rng.normal(0, noise, (e - s, pool.shape[1])).astype(np.float32)
        xb[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return xb


class TiledChunks(Sequence):
    """chunks[i] = the real chunk (i mod n_real), renamed; rows < n_real are the real ones."""

    def __init__(self, real: list[dict], n: int):
        self.real, self.n = real, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        c = self.real[i % len(self.real)]
        return c if i < len(self.real) else {**c, "chunk_id": f"syn{i}:{c['chunk_id']}"}


def synthetic_bundle(n: int, kind: str = "flat", params: dict | None = None, *, n_real: int = 10_000,
                     index=None, xb: np.ndarray | None = None):
    """A Bundle of n chunks in memory (nothing written), index `kind` built over embeddings(n).

    `index`/`xb` may be passed in to reuse a built FAISS index and its embeddings.
    """
    from softknn.retrieval.chunk_index import ChunkIndex, choose_index
    from softknn.storage.bundle import load_bundle
    from softknn.storage.layout import Bundle
    from softknn.storage.memory_stores import KVStore

    real = load_bundle(bundle_path(n_real), verify=False)
    xb = embeddings(n) if xb is None else xb
    spec = choose_index(n, xb.shape[1], kind, params)
    if index is None:
        index = cached_index(xb, spec)
    rows = np.arange(n) % len(real)
    kv = KVStore(real.kv.keys, real.kv.values, real.kv.start[rows], real.kv.count[rows])
    manifest = real.manifest.replaced(index={"kind": spec.kind, "params": spec.params, "reason": spec.reason},
                                      counts={**real.manifest.raw["counts"], "chunks": n}, version_id=f"bench-{n}-{spec.kind}")
    return Bundle(path=real.path, manifest=manifest, index=ChunkIndex(index, xb, spec, use_gpu=device() == "cuda"), kv=kv,
                  chunks=TiledChunks(real.chunks, n), token_spans=real.token_spans, labels=real.labels)


def cached_index(xb: np.ndarray, spec):
    """build_index_fast(xb, spec), kept under CACHE keyed by size, kind and parameters."""
    import hashlib

    import faiss

    build = {k: v for k, v in spec.params.items() if k not in SEARCH_PARAMS}
    key = hashlib.sha256(json.dumps([len(xb), NOISE, spec.kind, build], sort_keys=True).encode()).hexdigest()[:12]
    path = CACHE / f"index-{len(xb)}-{spec.kind}-{key}.faiss"
    if path.is_file():
        return faiss.read_index(str(path))
    index = build_index_fast(xb, spec)
    tmp = path.with_suffix(".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return index


def trained_quantizer(xb: np.ndarray, nlist: int, train_max: int):
    """IndexFlatIP over k-means centroids of a train_max-row sample (cached: IVF and IVF-PQ share it)."""
    import faiss

    path = CACHE / f"centroids-{len(xb)}-{nlist}-{train_max}.npy"
    if path.is_file():
        c = np.load(path)
    else:
        sample = xb[np.random.default_rng(SEED).choice(len(xb), train_max, replace=False)]
        km = faiss.Kmeans(xb.shape[1], nlist, niter=20, seed=SEED, spherical=True)
        km.train(sample)
        c = km.centroids
        np.save(path, c)
    q = faiss.IndexFlatIP(xb.shape[1])
    q.add(c)
    return q


def build_index_fast(xb: np.ndarray, spec, train_max: int = 65_536):
    """The same FAISS index memory.build_index makes for `spec`, built with every thread, and IVF
    coarse quantizers trained on at most `train_max` rows (k-means on 1M rows takes too long here;
    spherical k-means, 20 iterations, where faiss's IVF training runs plain k-means, 25).

    faiss's OpenMP thread count is also torch's (one OpenMP runtime), so it is restored after.
    """
    import faiss

    prev = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    try:
        return _build(xb, spec, train_max)
    finally:
        faiss.omp_set_num_threads(prev)


def _build(xb: np.ndarray, spec, train_max: int):
    import faiss

    from softknn.retrieval.chunk_index import build_index

    n, d = xb.shape
    if spec.kind in ("flat", "hnsw") or n <= train_max:
        if spec.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, int(spec.params["M"]), faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = int(spec.params["efConstruction"])
            index.add(xb)
            return index
        return build_index(xb, spec)
    p = spec.params
    quantizer = trained_quantizer(xb, int(p["nlist"]), train_max)
    if spec.kind == "ivf":
        index = faiss.IndexIVFFlat(quantizer, d, int(p["nlist"]), faiss.METRIC_INNER_PRODUCT)
    else:  # the coarse quantizer is already trained, so train() only trains the PQ codebooks
        index = faiss.IndexIVFPQ(quantizer, d, int(p["nlist"]), int(p["m"]), int(p["nbits"]), faiss.METRIC_INNER_PRODUCT)
        index.train(xb[np.random.default_rng(SEED).choice(n, train_max, replace=False)])
    index.add(xb)
    return index


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--real", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)
    res = prepare(args.real)
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":  # python -m bench kb: the same as python -m bench kb
    import sys

    from bench.__main__ import main

    main(["kb", *sys.argv[1:]])
