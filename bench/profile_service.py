"""Profile the softknn server under load with py-spy; writes bench/results/profile_service_cN.txt.

    python -m bench profile_service [--clients 1,16] [--duration 12] [--threads 1] [--runtime torch|onnx]

With --runtime onnx the server runs SOFTKNN_MODEL__RUNTIME=onnx and the files are named
profile_service_onnx_cN.txt.

Starts `python -m softknn.service.cli` on the 10k real bundle (bench/kb.py) on 127.0.0.1, samples it with
`py-spy record --format raw` (every thread, GIL-idle samples dropped) while c asyncio+httpx
clients send one-input POST /v1/infer requests for --duration s (bench/service.py's client), and
reports per thread the share of samples in which each function appears (inclusive).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import RESULTS
from bench.kb import set_threads
from bench.service import load, ready, request_for, softknn_server

WATCH = ("Engine.infer", "forward_plain", "retrieve", "fuse", "gather", "forward_fused", "fused_attention", "result",
         "evidence_items", "influence", "result_payload", "JSONResponse", "render", "dumps", "admit", "Batcher._run",
         "_wait_to_fill", "wait", "tokenize", "middleware", "validate", "select", "_run_once", "httptools", "h11")


def stacks(raw: Path) -> Iterator[tuple[str, list[str], int]]:
    """py-spy's collapsed (raw) stacks: (thread, its functions outermost first, samples) per line."""
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            thread, *frames = stack.split(";")
            yield thread, [f.split(" (")[0] for f in frames], int(n)


def summarize(raw: Path, top: int = 40) -> str:
    """Inclusive sample share per function, per thread, from py-spy's collapsed (raw) stacks."""
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for thread, names, n in stacks(raw):
        totals[thread] += n
        for f in set(names):
            per_thread[thread][f] += n
    out = []
    for thread, total in totals.most_common():
        out.append(f"\n== {thread}: {total} samples")
        for f, n in per_thread[thread].most_common(top):
            out.append(f"{100 * n / total:6.1f}%  {f}")
    return "\n".join(out)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runtime", default="torch", choices=["torch", "onnx"])


def run(args: argparse.Namespace) -> dict:
    os.environ["SOFTKNN_MODEL__RUNTIME"] = args.runtime
    tag = "" if args.runtime == "torch" else f"{args.runtime}_"
    set_threads(args.threads)
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), SOFTKNN_MODEL__THREADS=str(args.threads))

    import csv

    from bench.kb import SHARED, bundle_path

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        queries = [r["text"] for r in csv.DictReader(f)][:500]
    srv = ready(softknn_server("softknn", bundle_path(10_000)))
    method, path, kw = request_for("softknn", {})
    out = {"command": args.command, "profiles": {}}
    try:
        asyncio.run(load(srv.url, method, path, kw, queries, 4, 3))  # warm-up
        for c in [int(x) for x in args.clients.split(",")]:
            raw = RESULTS / f"profile_service_{tag}c{c}.raw"
            spy = subprocess.Popen([pyspy, "record", "--pid", str(srv.proc.pid), "--format", "raw", "--output", str(raw),
                                    "--rate", "500", "--threads", "--duration", str(int(args.duration) + 2), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            time.sleep(1)
            r = asyncio.run(load(srv.url, method, path, kw, queries, c, args.duration))
            spy.wait(60)
            text = (f"python -m bench profile_service --clients {args.clients} --duration {args.duration} "
                    f"--threads {args.threads} --runtime {args.runtime}\nclients {c}: {r['req_per_s']:.1f} req/s, p50 {r.get('p50_ms', 0):.1f} ms\n"
                    + summarize(raw))
            (RESULTS / f"profile_service_{tag}c{c}.txt").write_text(text)
            raw.replace(Path("/tmp") / raw.name)  # kept outside the tree for a closer look
            print(text[:5000], flush=True)
            out["profiles"][c] = {"file": str(RESULTS / f"profile_service_{tag}c{c}.txt"), **r}
    finally:
        srv.close()
    return out


if __name__ == "__main__":  # python -m bench profile_service: the same as python -m bench profile_service
    import sys

    from bench.__main__ import main

    main(["profile_service", *sys.argv[1:]])
