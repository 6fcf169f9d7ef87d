"""The fused pass reusing the plain pass's q, k, v at the memory layer vs recomputing them.

    python -m bench qkv_reuse [--queries 50] [--rounds 6] [--threads 1]

Real queries (bench/kb.py) over the 10k real bundle, k = 8, evidence 5. For each query the plain
pass runs twice (with the memory layer's q, k, v kept, and without); then Engine.fuse (K/V gather,
the resumed memory layer, evidence) runs on both, interleaved, and the answers are compared.
Writes bench/results/qkv_reuse.json|png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.common import RESULTS, write
from bench.kb import set_threads


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    import numpy as np

    from bench.kb import device, queries, synthetic_bundle
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder

    engine = Engine(Encoder(device=device()), synthetic_bundle(10_000, "flat"))
    enc, p, cases = engine.encoder, InferParams(k=8, evidence=5), []
    for q in queries(args.queries):
        batch = enc.tokenize([q])
        kept = enc.forward_plain(batch, keep_hidden=True, capture_layer=engine.layer)
        plain = enc.forward_plain(batch, keep_hidden=True)
        cases.append((batch, kept, plain, engine.retrieve(kept.embedding.float().cpu().numpy(), [p])))
    diff = max(float(np.abs(np.array(engine.fuse(b, k, r, [p])[0].embedding) -
                            np.array(engine.fuse(b, pl, r, [p])[0].embedding)).max()) for b, k, pl, r in cases)
    reuse, recompute = [], []
    for _ in range(args.rounds):
        for batch, kept, plain, retr in cases:
            for pp, acc in ((kept, reuse), (plain, recompute)):
                c0 = time.process_time()
                engine.fuse(batch, pp, retr, [p])
                acc.append(time.process_time() - c0)
    row = {"reuse_cpu_ms": statistics.median(reuse) * 1e3, "recompute_cpu_ms": statistics.median(recompute) * 1e3,
           "saved_ms": (statistics.median(recompute) - statistics.median(reuse)) * 1e3, "max_abs_embedding_diff": diff,
           "calls": len(reuse)}
    print(json.dumps(row))
    written = write("qkv_reuse", {"command": f"python -m bench qkv_reuse --queries {args.queries} --rounds {args.rounds} "
                                   f"--threads {args.threads}", "rows": [row]})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(["recompute q, k, v", "reuse q, k, v"], [row["recompute_cpu_ms"], row["reuse_cpu_ms"]], color=["#999", "#4C72B0"])
    ax.set_ylabel("CPU ms per Engine.fuse (median)")
    ax.set_title("Fused pass, k=8, evidence 5, one input")
    fig.tight_layout()
    fig.savefig(RESULTS / "qkv_reuse.png", dpi=110)
    plt.close(fig)
    return written


if __name__ == "__main__":  # python -m bench qkv_reuse: the same as python -m bench qkv_reuse
    import sys

    from bench.__main__ import main

    main(["qkv_reuse", *sys.argv[1:]])
