"""Scaling curves: latency and memory as the KB grows (10k → 1M) and as the input grows (8 → 256 tokens).

    python -m bench scaling [--sizes 10000,30000,100000,300000,1000000] [--kinds flat,hnsw]
                            [--lengths 8,16,32,64,128,256] [--repeats 15]

Needs `python -m bench kb` first (bench/kb.py says what is synthetic beyond the 10k real bundle).
KB growth, per size and index: one-query search (k=8), and Engine.infer (k=8) interleaved with the
plain forward on the same real queries; memory: embeddings, FAISS index, and the K/V a real
bundle of that size would hold (size × the real bundle's mean memory tokens per chunk × nh·hs ×
2 tensors × 4 bytes; the synthetic KB itself shares the real bundle's K/V rows).
Input length, on the real 10k bundle (flat, k=8): real ObliQA question text cut to exactly T
tokens (with [CLS]/[SEP]), fused vs plain, interleaved.
Each curve also gets its log-log slope between the smallest and largest point: 1 = linear.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import time

import faiss
import numpy as np

from bench.common import RESULTS, timed_pair, write
from bench.kb import set_threads


def slope(xs: list[float], ys: list[float]) -> float:
    return math.log(ys[-1] / ys[0]) / math.log(xs[-1] / xs[0])


def texts_of_length(tokenizer, base: list[str], T: int) -> list[str]:
    """Real text cut (or repeated, then cut) to exactly T tokens including the two specials."""
    out = []
    for s in base:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        while len(ids) < T:
            ids = ids + ids
        text = tokenizer.decode(ids[: T - 2])
        if len(tokenizer(text)["input_ids"]) == T:
            out.append(text)
    return out


def kb_growth(enc, sizes: list[int], kinds: list[str], texts: list[str], xq: np.ndarray, repeats: int) -> list[dict]:
    from bench.fused_forward import plain_forward
    from bench.kb import embeddings, synthetic_bundle
    from softknn.infer.engine import Engine, InferParams

    rows, p = [], InferParams(k=8)
    for n in sizes:
        xb = embeddings(n)
        for kind in kinds:
            bundle = synthetic_bundle(n, kind, xb=xb)
            engine = Engine(enc, bundle)
            ci = bundle.index
            qs = itertools.cycle(xq)
            search: list[float] = []
            search_cpu: list[float] = []
            for _ in range(3 * repeats):
                q = next(qs)[None]
                c0, t0 = time.process_time(), time.perf_counter()
                ci.search(q, 8)
                search.append(time.perf_counter() - t0)
                search_cpu.append(time.process_time() - c0)
            qa, qb = itertools.cycle(texts), itertools.cycle(texts)
            engine.infer([texts[0]], p)
            fused, plain = timed_pair(lambda e=engine, qa=qa: e.infer([next(qa)], p),
                                      lambda qb=qb: plain_forward(enc, next(qb)), repeats)
            kv = bundle.kv
            tok_per_chunk = float(np.mean(kv.count[: min(n, 10_000)]))
            index_bytes = xb.nbytes if kind == "flat" else int(faiss.serialize_index(ci.index).nbytes)
            row = {"size": n, "index": kind, "search_ms": float(np.median(search) * 1e3),
                   "search_cpu_ms": float(np.median(search_cpu) * 1e3),
                   "fused_ms": fused["median_s"] * 1e3, "fused_min_ms": fused["min_s"] * 1e3, "fused_max_ms": fused["max_s"] * 1e3,
                   "plain_ms": plain["median_s"] * 1e3, "ratio": fused["median_s"] / plain["median_s"],
                   "fused_cpu_ms": fused["cpu_median_s"] * 1e3, "plain_cpu_ms": plain["cpu_median_s"] * 1e3,
                   "ratio_cpu": fused["cpu_median_s"] / plain["cpu_median_s"],
                   "embeddings_bytes": xb.nbytes, "index_bytes": index_bytes,
                   "kv_bytes_real_equivalent": int(n * tok_per_chunk * kv.num_heads * kv.head_dim * 2 * 4),
                   "rss_bytes": rss()}
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            del engine, bundle, ci
            gc.collect()
        del xb
        gc.collect()
    return rows


def input_length(enc, lengths: list[int], base: list[str], repeats: int) -> list[dict]:
    from bench.fused_forward import plain_forward
    from bench.kb import synthetic_bundle
    from softknn.infer.engine import Engine, InferParams

    engine = Engine(enc, synthetic_bundle(10_000, "flat"))
    p, rows = InferParams(k=8), []
    for T in lengths:
        texts = texts_of_length(enc.tokenizer, base, T)[:20]
        qa, qb = itertools.cycle(texts), itertools.cycle(texts)
        engine.infer([texts[0]], p)
        fused, plain = timed_pair(lambda: engine.infer([next(qa)], p),  # noqa: B023 (called before the next T)
                                  lambda: plain_forward(enc, next(qb)), repeats)  # noqa: B023
        row = {"tokens": T, "fused_ms": fused["median_s"] * 1e3, "fused_min_ms": fused["min_s"] * 1e3,
               "fused_max_ms": fused["max_s"] * 1e3, "plain_ms": plain["median_s"] * 1e3,
               "plain_min_ms": plain["min_s"] * 1e3, "plain_max_ms": plain["max_s"] * 1e3,
               "ratio": fused["median_s"] / plain["median_s"],
               "fused_cpu_ms": fused["cpu_median_s"] * 1e3, "plain_cpu_ms": plain["cpu_median_s"] * 1e3,
               "ratio_cpu": fused["cpu_median_s"] / plain["cpu_median_s"]}
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    return rows


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def plot(name: str, kb: list[dict], ln: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    for kind in sorted({r["index"] for r in kb}):
        rs = [r for r in kb if r["index"] == kind]
        x = [r["size"] for r in rs]
        a.plot(x, [r["fused_cpu_ms"] for r in rs], "o-", label=f"fused ({kind})")
        a.plot(x, [r["search_cpu_ms"] for r in rs], "s--", label=f"search only ({kind})")
        b.plot(x, [r["index_bytes"] / 2**20 for r in rs], "o-", label=f"index ({kind})")
    rs = [r for r in kb if r["index"] == kb[0]["index"]]
    a.plot([r["size"] for r in rs], [r["plain_cpu_ms"] for r in rs], "k:", label="plain forward")
    b.plot([r["size"] for r in rs], [r["kv_bytes_real_equivalent"] / 2**20 for r in rs], "k--", label="K/V (real-bundle equivalent)")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("KB chunks")
        ax.legend(fontsize=7)
    a.set_ylabel("CPU ms per input (median)")
    a.set_title("Latency vs KB size (k=8)")
    b.set_ylabel("MiB")
    b.set_title("Memory vs KB size")
    if ln:
        x = [r["tokens"] for r in ln]
        c.plot(x, [r["fused_cpu_ms"] for r in ln], "o-", label="fused (10k flat, k=8)")
        c.plot(x, [r["plain_cpu_ms"] for r in ln], "s-", label="plain forward")
        c.set_xscale("log", base=2)
        c.set_yscale("log")
        c.set_xlabel("input tokens")
        c.set_ylabel("CPU ms per input (median)")
        c.set_title("Latency vs input length")
        c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="10000,30000,100000,300000,1000000")
    ap.add_argument("--kinds", default="flat,hnsw")
    ap.add_argument("--lengths", default="8,16,32,64,128,256")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--name", default="scaling")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    from bench.kb import CACHE, device, queries
    from softknn.model.encoder import Encoder

    enc = Encoder(device=device())
    texts = queries(40)
    xq = np.load(CACHE / "queries.npy")
    ln = input_length(enc, [int(x) for x in args.lengths.split(",")], queries(200)[::2], args.repeats) if args.lengths else []
    kb = kb_growth(enc, [int(s) for s in args.sizes.split(",")], args.kinds.split(","), texts, xq, args.repeats)
    slopes = {}
    for kind in sorted({r["index"] for r in kb}):
        rs = [r for r in kb if r["index"] == kind]
        if len(rs) > 1:
            x = [r["size"] for r in rs]
            slopes[kind] = {k: slope(x, [r[k] for r in rs])
                            for k in ("search_ms", "search_cpu_ms", "fused_ms", "fused_cpu_ms", "index_bytes")}
    if len(ln) > 1:
        x = [r["tokens"] for r in ln]
        slopes["input_length"] = {k: slope(x, [r[k] for r in ln]) for k in ("fused_ms", "plain_ms", "fused_cpu_ms", "plain_cpu_ms")}
    written = write(args.name, {"command": f"python -m bench scaling --sizes {args.sizes} --kinds {args.kinds} "
                                 f"--lengths {args.lengths} --repeats {args.repeats} --threads {args.threads} --name {args.name}",
                      "kb_growth": kb, "input_length": ln, "loglog_slopes": slopes})
    plot(args.name, kb, ln)
    print(json.dumps(slopes, indent=2))
    return written


if __name__ == "__main__":  # python -m bench scaling: the same as python -m bench scaling
    import sys

    from bench.__main__ import main

    main(["scaling", *sys.argv[1:]])
