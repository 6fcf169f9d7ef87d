"""Micro-batch grouping: one padded pass vs length-sorted passes of g texts (Engine.infer group_size).

    python -m bench grouping [--batches 16,32] [--groups 1,2,4,8] [--threads 1]

Real short inputs (Banking77 test texts, shuffled with a fixed seed), the 10k real bundle
(bench/kb.py), k = 8, evidence 5: the service's micro-batches. For each micro-batch size B, the
same batches run as one pass of B texts (group_size=0) and as length-sorted passes of g texts,
interleaved; CPU ms per text (median over the batches). Writes bench/results/grouping.json|png.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import time

from bench.common import RESULTS, write
from bench.kb import set_threads


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--groups", default="1,2,4,8")
    ap.add_argument("--texts", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="grouping")


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    from bench.kb import SHARED, device, synthetic_bundle
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder

    engine = Engine(Encoder(device=device()), synthetic_bundle(10_000, "flat"))
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    random.Random(0).shuffle(texts)
    texts = texts[: args.texts]
    lengths = [len(engine.encoder.tokenizer(t)["input_ids"]) for t in texts]
    p = InferParams(k=8, evidence=5)
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        batches = [texts[i : i + B] for i in range(0, len(texts) - B + 1, B)]
        groups = [0] + [int(g) for g in args.groups.split(",") if int(g) < B]  # 0: one pass of B
        for g in groups:  # warm-up
            engine.infer(batches[0], p, group_size=g)
        cpu = {g: [] for g in groups}
        for b in batches:
            for g in groups:
                c0 = time.process_time()
                engine.infer(b, p, group_size=g)
                cpu[g].append((time.process_time() - c0) / len(b))
        for g in groups:
            rows.append({"batch": B, "group_size": g or B, "one_pass": g == 0, "batches": len(batches),
                         "cpu_ms_per_text": statistics.median(cpu[g]) * 1e3,
                         "cpu_ms_per_text_min": min(cpu[g]) * 1e3, "cpu_ms_per_text_max": max(cpu[g]) * 1e3})
            print(json.dumps(rows[-1]), flush=True)
    written = write(args.name, {"command": f"python -m bench grouping --batches {args.batches} --groups {args.groups} "
                                 f"--texts {args.texts} --threads {args.threads} --name {args.name}",
                       "token_lengths": {"mean": statistics.mean(lengths), "median": statistics.median(lengths),
                                         "max": max(lengths)}, "rows": rows})
    plot(rows, args.name)
    return written


def plot(rows: list[dict], name: str = "grouping") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for B in sorted({r["batch"] for r in rows}):
        rs = sorted([r for r in rows if r["batch"] == B], key=lambda r: r["group_size"])
        ax.plot([r["group_size"] for r in rs], [r["cpu_ms_per_text"] for r in rs], "o-", label=f"micro-batch of {B}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("texts per forward pass (length-sorted); the last point is one pass of the whole batch")
    ax.set_ylabel("CPU ms per text (median)")
    ax.set_title("Engine.infer: one padded pass vs length-sorted groups (1 thread)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # python -m bench grouping: the same as python -m bench grouping
    import sys

    from bench.__main__ import main

    main(["grouping", *sys.argv[1:]])
