"""ANN quality and speed against exact search, per index type, at 100k and 1M chunks.

    python -m bench ann [--sizes 100000,1000000] [--queries 200] [--delta-queries 20]

Needs `python -m bench kb` first (bench/kb.py says what is synthetic). For each size and index
(flat; hnsw over efSearch; ivf and ivfpq over nprobe — every other parameter as
memory.choose_index sets it), over the same real queries:
    recall@k     |R_index ∩ R_exact| / k for k = 8 and 32 (R_exact: brute force over all chunks)
    search       one query per call through ChunkIndex.search (IVF-PQ includes its exact re-rank)
    memory       the FAISS index's serialized bytes, and the bytes search needs in all (IVF-PQ
                 re-ranks from the embeddings, so it needs them too)
    max |Δout|   max over queries and dims of |fused embedding (index) − fused embedding (exact)|
                 from Engine.infer, k = 8
Build time is reported but built with every thread (bench.kb.build_index_fast), not the
builder's single thread, and IVF quantizers trained on a 65,536-row sample.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import faiss
import numpy as np

from bench.common import write
from bench.kb import set_threads

SWEEP = {"flat": ("-", [None]), "hnsw": ("efSearch", [32, 64, 128, 256, 512]), "ivf": ("nprobe", [8, 16, 32, 64, 128]),
         "ivfpq": ("nprobe", [8, 16, 32, 64, 128])}


def recall(I: np.ndarray, E: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(I.tolist(), E.tolist(), strict=True)]))


def search_ms(ci, xq: np.ndarray, k: int) -> dict:
    """Wall and process-CPU ms of one-query searches (CPU excludes time spent descheduled)."""
    t, c = [], []
    for q in xq:
        c0, t0 = time.process_time(), time.perf_counter()
        ci.search(q[None], k)
        t.append(time.perf_counter() - t0)
        c.append(time.process_time() - c0)
    return {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "max_ms": max(t) * 1e3,
            "cpu_median_ms": statistics.median(c) * 1e3}


def run_size(n: int, xq: np.ndarray, texts: list[str], enc, kinds: list[str], n_delta: int) -> list[dict]:
    from bench.kb import cached_index, embeddings, synthetic_bundle
    from softknn.infer.engine import Engine, InferParams
    from softknn.retrieval.chunk_index import choose_index

    xb = embeddings(n)
    E = {}
    rows = []
    for kind in kinds:
        spec = choose_index(n, xb.shape[1], kind)
        t0 = time.perf_counter()
        index = cached_index(xb, spec)
        build_s = time.perf_counter() - t0
        index_bytes = int(faiss.serialize_index(index).nbytes) if kind != "flat" else xb.nbytes
        name, values = SWEEP[kind]
        for v in values:
            params = dict(spec.params) if v is None else {**spec.params, name: v}
            bundle = synthetic_bundle(n, kind, params, index=index, xb=xb)
            ci = bundle.index
            if not E:
                E = {k: ci.search(xq, k, exact=True)[1] for k in (8, 32)}
            row = {"size": n, "index": kind, "params": params, "build_or_load_s": build_s,
                   "index_bytes": index_bytes,
                   "search_bytes": index_bytes + (xb.nbytes if kind == "ivfpq" else 0)}
            for k in (8, 32):
                row[f"recall@{k}"] = recall(ci.search(xq, k)[1], E[k], k)
                row[f"search_k{k}"] = search_ms(ci, xq, k)
            engine = Engine(enc, bundle)
            deltas = []
            for q in texts[:n_delta]:
                a = engine.infer([q], InferParams(k=8))[0].embedding
                b = engine.infer([q], InferParams(k=8, exact=True))[0].embedding
                deltas.append(float(np.max(np.abs(np.subtract(a, b)))))
            row["max_abs_delta_output"] = max(deltas)
            row["queries_with_delta_gt_1e-5"] = sum(d > 1e-5 for d in deltas)
            rows.append(row)
            print(json.dumps({x: row[x] for x in ("size", "index", "recall@8", "recall@32", "max_abs_delta_output")}
                             | {"p": v, "search_ms": round(row["search_k8"]["median_ms"], 3),
                                "search_cpu_ms": round(row["search_k8"]["cpu_median_ms"], 3),
                                "MB": round(row["search_bytes"] / 2**20)}), flush=True)
            del engine, bundle, ci
        del index
        gc.collect()
    return rows


def plot(name: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS

    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    colors = {"flat": "#4C72B0", "hnsw": "#DD8452", "ivf": "#55A868", "ivfpq": "#C44E52"}
    for ax, n in zip(axes[0], sizes, strict=True):
        for kind, c in colors.items():
            rs = [r for r in rows if r["size"] == n and r["index"] == kind]
            if not rs:
                continue
            x = [r["search_k8"]["cpu_median_ms"] for r in rs]
            y = [r["recall@8"] for r in rs]
            ax.plot(x, y, "o-", color=c, label=f"{kind} ({rs[0]['search_bytes'] / 1e6:,.0f} MB to search)")
            p = SWEEP[kind][0]
            for r in rs:
                if p in r["params"]:
                    ax.annotate(str(r["params"][p]), (r["search_k8"]["cpu_median_ms"], r["recall@8"]), fontsize=7)
        ax.axhline(0.95, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("CPU ms per one-query search (median, k=8, 1 thread)")
        ax.set_ylabel("recall@8 vs exact")
        ax.set_title(f"{n:,} chunks")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--kinds", default="flat,hnsw,ivf,ivfpq")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--delta-queries", type=int, default=20)
    ap.add_argument("--name", default="ann")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    from bench.kb import CACHE, device, queries
    from softknn.model.encoder import Encoder

    enc = Encoder(device=device())
    xq = np.load(CACHE / "queries.npy")[: args.queries]
    texts = queries(args.queries)
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        rows += run_size(n, xq, texts, enc, args.kinds.split(","), args.delta_queries)
    written = write(args.name, {"command": f"python -m bench ann --sizes {args.sizes} --kinds {args.kinds} "
                                 f"--queries {args.queries} --delta-queries {args.delta_queries} --threads {args.threads} --name {args.name}",
                      "queries": len(xq), "rows": rows})
    plot(args.name, rows)
    return written


if __name__ == "__main__":  # python -m bench ann: the same as python -m bench ann
    import sys

    from bench.__main__ import main

    main(["ann", *sys.argv[1:]])
