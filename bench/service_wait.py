"""Where a one-client request's time goes, with the batcher's fill wait on (default 2 ms) and off.

    python -m bench.service_wait [--rounds 2] [--requests 120] [--threads 1]

Starts the softknn server on the 10k real bundle (bench/kb.py), 127.0.0.1 only, alternately with
SOFTKNN_BATCHING__MAX_WAIT_MS=2 and =0 (--rounds times each), sends --requests sequential one-input
requests, and reads the server's own /metrics: mean queue wait (softknn_queue_wait_seconds) and
mean micro-batch inference time (softknn_inference_seconds), beside the client's p50.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

import httpx

from bench.common import write
from bench.kb import set_threads
from bench.service import Server


def metrics(c: httpx.Client) -> dict[str, float]:
    out = {}
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("softknn_") and "{" not in line and line.split()[0].endswith(("_sum", "_count")):
            k, v = line.split()
            out[k] = float(v)
    return out


def probe(bundle, queries: list[str], wait_ms: str, n: int) -> dict:
    srv = Server(f"wait{wait_ms}", [sys.executable, "-m", "service.cli", "--bundle", str(bundle), "--port", "{port}",
                                    "--log-level", "warning"], "/readyz", env={"SOFTKNN_BATCHING__MAX_WAIT_MS": wait_ms}).wait()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            body = lambda q: {"inputs": [q], "k": 8, "evidence": 5}  # noqa: E731
            for q in queries[:10]:
                c.post("/v1/infer", json=body(q)).raise_for_status()
            m0, lat = metrics(c), []
            for q in queries[10 : 10 + n]:
                t0 = time.perf_counter()
                c.post("/v1/infer", json=body(q)).raise_for_status()
                lat.append(time.perf_counter() - t0)
            m1 = metrics(c)
    finally:
        srv.stop()
    d = {k: m1[k] - m0.get(k, 0.0) for k in m1}
    mean = lambda name: 1e3 * d[f"{name}_sum"] / d[f"{name}_count"]  # noqa: E731
    return {"max_wait_ms": float(wait_ms), "client_p50_ms": statistics.median(lat) * 1e3,
            "queue_wait_ms": mean("softknn_queue_wait_seconds"), "inference_ms": mean("softknn_inference_seconds")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    set_threads(args.threads)
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), SOFTKNN_MODEL__THREADS=str(args.threads))

    from bench.kb import SHARED, bundle_path

    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        queries = [r["text"] for r in csv.DictReader(f)][:200]
    rows = []
    for _ in range(args.rounds):
        for wait in ("2", "0"):
            rows.append(probe(bundle_path(10_000), queries, wait, args.requests))
            print(json.dumps({k: round(v, 2) for k, v in rows[-1].items()}), flush=True)
    write("service_wait", {"command": f"python -m bench.service_wait --rounds {args.rounds} --requests {args.requests} "
                                      f"--threads {args.threads}", "rows": rows})


if __name__ == "__main__":
    main()
