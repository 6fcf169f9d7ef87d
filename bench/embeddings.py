"""/v1/embeddings through the official openai client against /v1/infer at α = 1, one server, one client.

    python -m bench embeddings [--rounds 200] [--bundle bundles/sample]

One `softknn serve` (one torch thread) on the sample bundle; each round sends one sample query
(softknn/sample_kb/queries.jsonl, in turn) to every arm, in turn, one request at a time:
  - openai_base64: `openai.OpenAI(...).embeddings.create(model=..., input=[q])` as it comes (the
    client asks for base64 and decodes it);
  - openai_float: the same with encoding_format="float";
  - infer_alpha1: POST /v1/infer {"inputs": [q], "alpha": 1} with httpx (what the plain embedding
    equals), the service's default evidence;
  - infer_alpha1_no_evidence: the same with evidence 0.
Latency is the client's wall time per request; p50/p90 per arm. The plain embeddings are checked
against /v1/infer's at α = 1 (max |Δ|). Writes bench/results/embeddings.json|png.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.common import plot_bars, summary, write
from tests.harness import REPO, LiveServer, ensure_bundle

MODEL = "all-MiniLM-L6-v2"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=200, help="requests per arm")
    ap.add_argument("--bundle", type=Path, default=REPO / "bundles" / "sample",
                    help="bundle to serve (built from the sample KB if missing)")


def run(args: argparse.Namespace) -> dict:
    import numpy as np
    import openai

    from softknn.cli import sample_kb_path

    queries = [json.loads(line)["text"] for line in (sample_kb_path().parent / "queries.jsonl").read_text().splitlines()
               if line.strip()]
    bundle = ensure_bundle(args.bundle)
    log = Path(tempfile.mkdtemp(prefix="softknn-bench-embeddings-")) / "server.log"
    with LiveServer.start(bundle, log, auth=False) as srv:
        api = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
        http = srv.client
        arms = {
            "openai_base64": lambda q: api.embeddings.create(model=MODEL, input=[q]).data[0].embedding,
            "openai_float": lambda q: api.embeddings.create(model=MODEL, input=[q], encoding_format="float")
            .data[0].embedding,
            "infer_alpha1": lambda q: http.post("/v1/infer", json={"inputs": [q], "alpha": 1.0}).json()
            ["results"][0]["embedding"],
            "infer_alpha1_no_evidence": lambda q: http.post("/v1/infer", json={"inputs": [q], "alpha": 1.0,
                                                                               "evidence": 0}).json()
            ["results"][0]["embedding"],
        }
        for q in queries[:5]:  # warm every path
            for fn in arms.values():
                fn(q)
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        worst = 0.0
        for i in range(args.rounds):
            q = queries[i % len(queries)]
            got = {}
            for name, fn in arms.items():
                t0 = time.perf_counter()
                got[name] = fn(q)
                seconds[name].append(time.perf_counter() - t0)
            worst = max(worst, float(np.abs(np.asarray(got["openai_base64"]) - np.asarray(got["infer_alpha1"])).max()))
    rows = {name: summary(v, scale=1e3, suffix="_ms") for name, v in seconds.items()}
    p50 = {name: r["p50_ms"] for name, r in rows.items()}
    figure = {
        "command": args.command if hasattr(args, "command") else f"python -m bench embeddings --rounds {args.rounds}",
        "rounds": args.rounds, "bundle": str(bundle), "arms": rows,
        "ratio_p50_openai_base64_vs_infer_alpha1": p50["openai_base64"] / p50["infer_alpha1"],
        "ratio_p50_openai_float_vs_infer_alpha1": p50["openai_float"] / p50["infer_alpha1"],
        "ratio_p50_openai_base64_vs_infer_no_evidence": p50["openai_base64"] / p50["infer_alpha1_no_evidence"],
        "max_abs_diff_plain_vs_infer_alpha1": worst,
    }
    print(json.dumps(figure, indent=2))
    written = write("embeddings", figure)
    plot_bars("embeddings", list(p50), list(p50.values()),
              [(rows[n]["p50_ms"], rows[n]["p90_ms"]) for n in p50], "ms per request (p50; bar to p90)",
              "/v1/embeddings (openai client) vs /v1/infer at α = 1, one client")
    return written


if __name__ == "__main__":  # python -m bench.embeddings: the same as python -m bench embeddings
    import sys

    from bench.__main__ import main

    main(["embeddings", *sys.argv[1:]])
