"""A generator build as a new user runs it: `softknn build KB --generator smollm2-135m-instruct` in its own
process, its wall time, its peak RSS, and where the time went (the manifest's generator pass and
calibration seconds; the rest is reading, encoding, indexing and λ).

    python -m bench gen_build [--kb obliqa|sample] [--passages 1000] [--memory q4]

The ObliQA KB is gen_quality's (`obliqa_qa_kb`: the hand-written questions' gold passages plus
distractors from their documents, ~1,000 passages), the regulatory KB a user would try.
→ bench/results/gen_build_<kb>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.common import write

ROOT = Path(__file__).resolve().parents[1]


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kb", default="obliqa", choices=["obliqa", "sample"])
    ap.add_argument("--passages", type=int, default=1000)
    ap.add_argument("--memory", default="", help="--generator-memory (default: the build's own)")


def run(args: argparse.Namespace) -> dict:
    from bench.gen_quality import QA_OBLIQA, obliqa_qa_kb
    from bench.generation import CACHE

    if args.kb == "sample":
        kb = ROOT / "softknn" / "sample_kb" / "kb"
    else:
        kb = obliqa_qa_kb([json.loads(x) for x in QA_OBLIQA.read_text().splitlines() if x.strip()], args.passages)
    out = CACHE / f"gen-build-{args.kb}"
    cmd = [sys.executable, "-m", "softknn", "build", str(kb), "--out", str(out), "--generator", "smollm2-135m-instruct",
           "--force"] + (["--generator-memory", args.memory] if args.memory else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"build failed ({proc.returncode}): {proc.stderr[-2000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    m = json.loads((out / "manifest.json").read_text())
    g = m["generator"]
    cal = g.get("calibration") or {}
    gen_s, cal_s = g.get("seconds"), cal.get("seconds")
    payload = {"command": getattr(args, "command", ""), "kb": str(kb), "chunks": m["counts"]["chunks"],
               "generator_tokens": g["tokens"], "memory": g["memory"], "bytes_per_token": g["bytes_per_token"],
               "build_wall_s": round(wall, 1), "builder_peak_rss_mb": round(peak_mb, 1),
               "generator_pass_s": gen_s, "calibration_s": cal_s,
               "calibration_share": round(cal_s / wall, 3) if cal_s else None,
               "calibration": {k: v for k, v in cal.items() if k not in ("grid", "examples")},
               "calibration_progress_shown": "generator calibration" in proc.stderr}
    print(json.dumps({k: v for k, v in payload.items() if k != "calibration"}, indent=1), flush=True)
    return write(f"gen_build_{args.kb}", payload)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["gen_build", *sys.argv[1:]])
