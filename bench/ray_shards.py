"""2 KB shards on Ray actors vs the single-process engine: p50 of one short input, max |Δ embedding|.

The sharded answer's max |Δ embedding| is taken against the one-index answer.

    python -m bench ray_shards [--n 100000] [--real 2000] [--queries 40] [--out bench/results/ray_shards.json]

The KB (bench/kb.py's recipe, smaller pool): a real bundle of `--real` texts (kb.kb_texts(): ObliQA
sentences and Banking77 train texts, built by `softknn build`), then rows up to N made of its real
embeddings plus Gaussian noise (σ 0.02, renormalised), each borrowing the K/V, token spans and text of
real chunk (row mod n_real), as kb.synthetic_bundle does (the K/V store is the real bundle's memory
map: RAM stays small). Flat (exact) index; dense retrieval (the synthetic KB has no BM25 index).

Both sides run the same Engine.infer (what the service's worker runs for a one-input request):
- single: one Bundle of N chunks in this process;
- ray: a softknn.storage.shards.ShardedBundle whose 2 shards (rows [0, N/2), [N/2, N)) are Ray actors
  (softknn.storage.ray_shards.RayShards, each actor building its half with the same recipe).
The queries (Banking77 test texts, short) alternate between the two, one at a time, so both see the same
machine load; p50 over `--queries` requests each after 5 warm-up requests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from bench import kb
from bench.common import percentile
from softknn.storage.shards import Shard

NOISE = 0.02


def real_bundle(n_real: int) -> Path:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.model.encoder import Encoder

    bp = kb.bundle_path(n_real)
    if not (bp / "manifest.json").is_file():
        kb.CACHE.mkdir(parents=True, exist_ok=True)
        src = kb.CACHE / f"kb-{n_real}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in kb.kb_texts()[:n_real]))
        build_bundle(src, bp, BuildConfig(batch_size=64, index_type="flat", memory="kv"), Encoder(), force=True,
                     progress=False)  # kv: rows_bundle tiles its KVStore
    return bp


def embeddings(real_xb: np.ndarray, n: int) -> np.ndarray:
    """Rows < n_real: the real embeddings; beyond: noisy replicas (kb.embeddings' recipe, this pool)."""
    xb = np.empty((n, real_xb.shape[1]), dtype=np.float32)
    m = min(n, len(real_xb))
    xb[:m] = real_xb[:m]
    if n > m:
        rng = np.random.default_rng(kb.SEED)
        x = real_xb[np.arange(m, n) % len(real_xb)] + rng.normal(0, NOISE, (n - m, real_xb.shape[1])).astype(np.float32)
        xb[m:] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return xb


def rows_bundle(n_real: int, n: int, lo: int, hi: int):
    """The Bundle of rows lo..hi−1 of the N-chunk KB (in memory; K/V shared with the real bundle)."""
    from softknn.retrieval.chunk_index import ChunkIndex, build_index, choose_index
    from softknn.storage.bundle import load_bundle
    from softknn.storage.layout import Bundle
    from softknn.storage.memory_stores import KVStore

    real = load_bundle(kb.bundle_path(n_real), verify=False)
    xb = np.ascontiguousarray(embeddings(np.asarray(real.index.xb), n)[lo:hi])
    spec = choose_index(hi - lo, xb.shape[1], "flat")
    rows = np.arange(lo, hi) % len(real)
    kv = KVStore(real.kv.keys, real.kv.values, real.kv.start[rows], real.kv.count[rows])
    manifest = real.manifest.replaced(index={"kind": "flat", "params": {}, "reason": "bench"},
                                      counts={**real.manifest.raw["counts"], "chunks": hi - lo},
                                      version_id=f"bench-{n}-{lo}-{hi}")
    return Bundle(path=real.path, manifest=manifest, index=ChunkIndex(build_index(xb, spec), xb, spec), kv=kv,
                  chunks=kb.TiledChunks(real.chunks, n)[lo:hi], token_spans=real.token_spans, labels=real.labels)


class BenchShard(Shard):
    """A Shard over rows lo..hi−1 of the synthetic KB (built in the actor, nothing written)."""

    def __init__(self, n_real: int, n: int, lo: int, hi: int, threads: int):
        kb.set_threads(threads)
        self.bundle, self.lo, self.n = rows_bundle(n_real, n, lo, hi), lo, hi - lo


def sharded(one, n_real: int, n: int, threads: int):
    from softknn.storage.ray_shards import RayShards
    from softknn.storage.shards import _KV, ShardedBundle, _Index

    half = n // 2
    backend = RayShards([(n_real, n, 0, half, threads), (n_real, n, half, n, threads)], actor_cls=BenchShard,
                        num_cpus=1, timeout_s=120)
    b = ShardedBundle(path=one.path, manifest=one.manifest.replaced(version_id=f"bench-{n}-2shards"), backend=backend,
                      chunks=one.chunks, lo=[0, half], labels=one.labels)
    b.index = _Index(b, one.index.spec)
    # every BenchShard's store is the whole real K/V (global token row = its row): first [0, 0] reads them from the last
    b.kv = _KV(b, one.kv.start, one.kv.count, one.kv.num_heads, one.kv.head_dim, [0, 0])
    b.token_spans = one.token_spans
    return b


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--real", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="torch/faiss threads of each process")
    ap.add_argument("--out", type=Path, default=Path("bench/results/ray_shards.json"))


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder

    kb.set_threads(args.threads)
    t0 = time.perf_counter()
    real_bundle(args.real)
    build_s = time.perf_counter() - t0
    enc = Encoder()
    one = rows_bundle(args.real, args.n, 0, args.n)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        two = sharded(one, args.real, args.n, args.threads)
        e1, e2 = Engine(enc, one), Engine(enc, two)
        qs = kb.queries(2 * (args.queries + 5))[1::2]  # the Banking77 test texts: short inputs
        p = InferParams()
        lat = {"single": [], "ray_2_shards": []}
        delta, same_ids = 0.0, True
        for i, q in enumerate(qs[: args.queries + 5]):
            res = {}
            for name, e in (("single", e1), ("ray_2_shards", e2)) if i % 2 else (("ray_2_shards", e2), ("single", e1)):
                t = time.perf_counter()
                res[name] = e.infer([q], p)[0]
                if i >= 5:
                    lat[name].append(time.perf_counter() - t)
            a, b = res["single"], res["ray_2_shards"]
            delta = max(delta, float(np.abs(np.asarray(a.embedding) - np.asarray(b.embedding)).max()))
            same_ids &= [x.chunk_id for x in a.evidence] == [x.chunk_id for x in b.evidence]
        two.close()
    finally:
        ray.shutdown()
    p50 = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    out = {
        "command": f"python -m bench ray_shards --n {args.n} --real {args.real} --queries {args.queries} --threads {args.threads}",
        "chunks": args.n, "real_chunks": args.real, "queries": args.queries, "threads": args.threads,
        "retrieval": "dense", "index": "flat", "k": p.k,
        "p50_ms": {k: round(v, 2) for k, v in p50.items()},
        "p90_ms": {k: round(percentile(v, 90) * 1e3, 2) for k, v in lat.items()},
        "ratio_p50": round(p50["ray_2_shards"] / p50["single"], 3),
        "max_abs_delta_embedding": delta, "same_evidence_ids_and_order": bool(same_ids),
        "real_bundle_build_s": round(build_s, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), load {os.getloadavg()[0]:.1f}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    plot(lat, out, args.out.with_suffix(".png"))
    return out


def plot(lat: dict, out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(lat)
    ax.boxplot([np.asarray(lat[k]) * 1e3 for k in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), ["single process", "Ray, 2 shard actors"])
    ax.set_ylabel("latency per one-input request (ms)")
    ax.set_title(f"{out['chunks']:,} chunks, dense, k {out['k']}: p50 ratio {out['ratio_p50']}, "
                 f"max |Δ| {out['max_abs_delta_embedding']:.1e}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":  # python -m bench ray_shards: the same as python -m bench ray_shards
    import sys

    from bench.__main__ import main

    main(["ray_shards", *sys.argv[1:]])
