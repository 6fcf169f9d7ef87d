"""Fused forward (one input, k=8 and k=32) beside the plain forward, KBs of ~10k, 100k and 1M chunks.

    python -m bench fused_forward [--sizes 10000,100000,1000000] [--kinds flat,hnsw] [--repeats 25]

Needs `python -m bench kb` first (the real bundle and the embedding pool; see bench/kb.py for what
is synthetic beyond 10k). Per (size, index, k), interleaved in one loop over the same real queries:
    plain:  tokenize → model forward → pooled, normalised embedding (what an embedding server does)
    fused:  Engine.infer([q], k=k): tokenize → plain pass (hidden states kept) → FAISS/exact search
            → gather K/V → resumed pass with the fused memory layer → evidence, diagnostics, labels
Also a stage breakdown of the fused side (medians), and recall@k of the index against exact search
for the timed queries.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time

import numpy as np
import torch

from bench.common import timed_pair, write
from bench.kb import set_threads

STAGES = ("tokenize", "plain_pass", "search", "gather_kv", "fused_pass", "evidence")


def summary(r: dict) -> dict:
    """ms from a bench.common.timed_pair side: wall median/min/max, and CPU median/min/max."""
    return {"median_ms": r["median_s"] * 1e3, "min_ms": r["min_s"] * 1e3, "max_ms": r["max_s"] * 1e3,
            "cpu_median_ms": r["cpu_median_s"] * 1e3, "cpu_min_ms": r["cpu_min_s"] * 1e3,
            "cpu_max_ms": r["cpu_max_s"] * 1e3, "n": len(r["runs"])}


def plain_forward(enc, text: str) -> np.ndarray:
    batch = enc.tokenize([text])
    return enc.forward_plain(batch).embedding.float().cpu().numpy()


def stage_times(engine, text: str, params) -> dict[str, dict[str, float]]:
    """One Engine.infer, split into its stages (same calls, timed between them): wall and CPU seconds."""
    from softknn.model.attention import fused_attention

    enc, marks = engine.encoder, []
    mark = lambda: marks.append((time.perf_counter(), time.process_time()))  # noqa: E731
    mark()
    batch = enc.tokenize([text])
    mark()
    plain = enc.forward_plain(batch, keep_hidden=True, capture_layer=engine.layer)  # as Engine.infer
    mark()
    retr = engine.retrieve(plain.embedding.float().cpu().numpy(), [params])
    mark()
    memory = engine.bundle.kv.gather(retr.rows, retr.weights, enc.device)
    mark()
    alpha, joint, cap = torch.tensor([params.alpha], device=enc.device), torch.tensor([False], device=enc.device), {}

    def fuse(q, k, v, scaling):
        cap["fr"] = fused_attention(q, k, v, batch.mask.to(enc.device), memory, alpha=alpha, joint=joint, scaling=scaling)
        return cap["fr"].out

    emb, tokens = enc.forward_fused(batch, engine.layer, fuse, plain)
    mark()
    engine.result(0, batch, cap["fr"], emb, tokens, retr, params)
    mark()
    wall, cpu = np.diff([m[0] for m in marks]), np.diff([m[1] for m in marks])
    return {"wall": dict(zip(STAGES, wall.tolist(), strict=True)), "cpu": dict(zip(STAGES, cpu.tolist(), strict=True))}


def measure(engine, texts: list[str], k: int, repeats: int, evidence: int = 5) -> dict:
    from softknn.infer.engine import InferParams

    p = InferParams(k=k, evidence=evidence)
    qa, qb = itertools.cycle(texts), itertools.cycle(texts)
    for q in texts[:3]:  # warm-up
        engine.infer([q], p)
        plain_forward(engine.encoder, q)
    fused, plain = timed_pair(lambda: engine.infer([next(qa)], p), lambda: plain_forward(engine.encoder, next(qb)), repeats)
    stages = [stage_times(engine, q, p) for q in itertools.islice(itertools.cycle(texts), max(5, repeats // 2))]
    return {
        "k": k,
        "fused": summary(fused),
        "plain": summary(plain),
        "ratio_fused_over_plain": fused["median_s"] / plain["median_s"],
        "ratio_fused_over_plain_cpu": fused["cpu_median_s"] / plain["cpu_median_s"],
        "stages_median_ms": {s: statistics.median(x["wall"][s] for x in stages) * 1e3 for s in STAGES},
        "stages_cpu_median_ms": {s: statistics.median(x["cpu"][s] for x in stages) * 1e3 for s in STAGES},
    }


def recall(bundle, xq: np.ndarray, k: int) -> float:
    _, I = bundle.index.search(xq, k)
    _, E = bundle.index.search(xq, k, exact=True)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(I.tolist(), E.tolist(), strict=True)]))


def _flat_exactness(bundle, xq: np.ndarray, k: int) -> float:
    """Flat: the fraction of queries whose fast answer is the exact one up to float round-off.

    Same ids, or ids whose scores (recomputed in float64) equal the exact answer's within 1e-6:
    the KB holds near-copies (one text embedded in two batches differs in the last bits), whose
    scores tie to ~1e-7, and two correct scans that sum in different orders may pick either.
    """
    _, I = bundle.index.search(xq, k)
    _, E = bundle.index.search(xq, k, exact=True)
    xb = np.asarray(bundle.index.xb, dtype=np.float64)
    same = []
    for q, a, b in zip(xq.astype(np.float64), I, E, strict=True):
        sa, sb = np.sort(xb[a] @ q), np.sort(xb[b] @ q)
        same.append(set(a.tolist()) == set(b.tolist()) or bool(np.abs(sa - sb).max() <= 1e-6))
    return float(np.mean(same))


def measure_sizes(sizes: list[int], kinds: list[str], ks: list[int], repeats: int, n_queries: int, evidence: int = 5) -> list[dict]:
    from bench.kb import device, embeddings, queries, synthetic_bundle
    from softknn.infer.engine import Engine
    from softknn.model.encoder import Encoder

    enc = Encoder(device=device())
    texts = queries(n_queries)
    rows = []
    for n in sizes:
        xb = embeddings(n)
        for kind in kinds:
            t0 = time.perf_counter()
            bundle = synthetic_bundle(n, kind, xb=xb)
            load_s = time.perf_counter() - t0
            engine = Engine(enc, bundle)
            xq = np.concatenate([plain_forward(enc, q) for q in texts])
            for k in ks:
                counts0 = dict(bundle.index.prefilter_counts)
                r = measure(engine, texts, k, repeats, evidence)
                # flat: how many searches the 8-bit prefilter certified (the rest took the full scan)
                pf = {c: bundle.index.prefilter_counts[c] - counts0[c] for c in counts0}
                r.update(size=n, index=kind, params=bundle.index.spec.params, index_ready_s=load_s, evidence=evidence,
                         recall_at_k=recall(bundle, xq, k) if kind != "flat" else _flat_exactness(bundle, xq, k),
                         prefilter=pf if any(pf.values()) else None)
                rows.append(r)
                print(json.dumps({x: r[x] for x in ("size", "index", "k", "ratio_fused_over_plain",
                                                    "ratio_fused_over_plain_cpu", "recall_at_k")}
                                 | {"fused_ms": round(r["fused"]["median_ms"], 2), "plain_ms": round(r["plain"]["median_ms"], 2),
                                    "fused_cpu_ms": round(r["fused"]["cpu_median_ms"], 2),
                                    "plain_cpu_ms": round(r["plain"]["cpu_median_ms"], 2),
                                    "stages_cpu": {s: round(v, 2) for s, v in r["stages_cpu_median_ms"].items()}}), flush=True)
            del engine, bundle
            gc.collect()
        del xb
        gc.collect()
    return rows


def plot(name: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS

    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"{r['size'] // 1000}k\n{r['index']}\nk={r['k']}" for r in rows]
    x = np.arange(len(rows))
    for off, key, color in ((-0.2, "plain", "#4C72B0"), (0.2, "fused", "#DD8452")):
        v = [r[key]["cpu_median_ms"] for r in rows]
        err = [[r[key]["cpu_median_ms"] - r[key]["cpu_min_ms"] for r in rows],
               [r[key]["cpu_max_ms"] - r[key]["cpu_median_ms"] for r in rows]]
        ax.bar(x + off, v, 0.4, yerr=err, capsize=3, color=color, label=key)
    for i, r in enumerate(rows):
        ax.text(i, r["fused"]["cpu_max_ms"], f"{r['ratio_fused_over_plain_cpu']:.2f}×\n(wall {r['ratio_fused_over_plain']:.2f}×)",
                ha="center", va="bottom", fontsize=6)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("CPU ms per input (median, min–max)")
    ax.set_title("Fused forward vs plain forward, one input, 1 thread (ratio above: CPU, wall)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--kinds", default="flat,hnsw")
    ap.add_argument("--ks", default="8,32")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--evidence", type=int, default=5, help="evidence items per answer (0: the forward without evidence)")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--name", default="fused_forward")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")
    ap.add_argument("--replot", nargs="*", help="only redraw NAME.png from the rows of these results")


def run(args: argparse.Namespace) -> dict:
    if args.replot:
        from bench.common import RESULTS

        rows = [r for n in args.replot for r in json.loads((RESULTS / f"{n}.json").read_text())["rows"]]
        plot(args.name, rows)
        return {"replot": args.replot, "rows": rows}
    set_threads(args.threads)
    rows = measure_sizes([int(s) for s in args.sizes.split(",")], args.kinds.split(","), [int(k) for k in args.ks.split(",")],
               args.repeats, args.queries, args.evidence)
    written = write(args.name, {"command": f"python -m bench fused_forward --sizes {args.sizes} --kinds {args.kinds} "
                                 f"--ks {args.ks} --repeats {args.repeats} --evidence {args.evidence} --threads {args.threads} "
                                 f"--name {args.name}", "rows": rows})
    plot(args.name, rows)
    return written


if __name__ == "__main__":  # python -m bench fused_forward: the same as python -m bench fused_forward
    import sys

    from bench.__main__ import main

    main(["fused_forward", *sys.argv[1:]])
