"""Where a batched decode step and a prefill spend their time: the decode loop driven by hand (no HTTP),
B = 1, 4, 16 rows of the sample KB's test questions at k = 8, one thread.

For each B: the loop's wall time per step split into the ORT run and the Python around it (masks,
binding, cache writes, token choice), and ONNX Runtime's own profile of a few steps summed per op type.
For one prefill (B = 1, the prompt after R's memory): the same split.

    python -m bench profile_decode [--rows 1,4,16] [--steps 24] [--k 8] [--weights q4a8,w8a8] [--kv fp32,int8]
                                   [--threads 1]

With several weight formats (`--weights`) and KV cache formats (`--kv`), each pair is profiled in turn
on the same prompts: `by_config["WEIGHTS/KV"]` holds each one's figures (`rows` and
`prefill_ms_median` at the top are the first pair's).

→ bench/results/profile_decode.json and profile_decode.png (step time per op type; the per-op table printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

from bench.common import write

ROOT = Path(__file__).resolve().parents[1]


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--weights", default="q4a8,w8a8", help="decode-graph weight formats, comma-separated")
    ap.add_argument("--kv", default="int8", help="KV cache formats, comma-separated (fp32, int8)")
    ap.add_argument("--ort-steps", type=int, default=4, help="steps profiled by ONNX Runtime's profiler per B")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of the decode graph")
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk (prompt tokens per graph run)")


def _op_table(path: str, last_runs: int) -> dict[str, float]:
    """ONNX Runtime's profile (chrome trace JSON) → milliseconds per op type, summed over the nodes of
    the session's last `last_runs` runs."""
    ev = json.loads(Path(path).read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "Session" and e.get("name") == "model_run")
    since = runs[-last_runs][0]
    per: dict[str, float] = defaultdict(float)
    for e in ev:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= since:
            per[e["args"].get("op_name", "?")] += e["dur"] / 1000.0
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def _timed_steps(loop, steps: int) -> dict:
    """Run `steps` decode steps; wall per step and the ORT run's share (Bound.run wrapped)."""
    from softknn.generate import runtime

    ort_s: list[float] = []
    orig = runtime.Bound.run

    def run(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            ort_s.append(time.perf_counter() - t0)

    runtime.Bound.run = run
    walls = []
    try:
        for _ in range(steps):
            if not loop.running:
                break
            t0 = time.perf_counter()
            loop._step()
            walls.append(time.perf_counter() - t0)
    finally:
        runtime.Bound.run = orig
    return {"steps": len(walls), "step_ms_median": round(1000 * statistics.median(walls), 2),
            "ort_ms_median": round(1000 * statistics.median(ort_s), 2),
            "python_ms_median": round(1000 * (statistics.median(walls) - statistics.median(ort_s)), 2)}


def run(args: argparse.Namespace) -> dict:
    import onnxruntime as ort

    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models, msgs, setup_threads
    from softknn.generate.batch import DecodeLoop, job_for
    from softknn.generate.engine import GenParams
    from softknn.generate.model import Sampling
    from softknn.generate.runtime import DecoderSession

    setup_threads()
    enc, gen = models()
    bundle, _ = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    ge = gen_engine(enc, gen, bundle)
    qs = [q["question"] for q in load_qa() if q["split"] == "test"]
    big = max(int(x) for x in args.rows.split(","))
    p = ge.resolve(GenParams(k=args.k, max_tokens=10_000))
    preps = [ge.prepare(p, None, msgs(q)) for q in qs[:big]]
    sampling = Sampling(max_tokens=args.steps + args.ort_steps + 4, temperature=0.0, stop=())
    eos: set[int] = set()  # no early stop: every row decodes every step
    out: dict = {"command": args.command, "weights": args.weights, "threads": args.threads, "k": args.k, "prefill_chunk": args.chunk, "memory_tokens_median": statistics.median(x.memory_tokens for x in preps),
                 "prompt_tokens_median": statistics.median(len(x.prefix + x.rest) for x in preps), "by_config": {}}

    def prefill(loop, job):
        loop.filling = loop._admit(job)
        while loop.filling is not None:
            loop._prefill_chunk(loop.filling, args.chunk)

    configs = [(gen.weights(w), kv) for w in args.weights.split(",") for kv in args.kv.split(",")]
    for w, kv in configs:
        calib = gen.calibration_ids()
        session = DecoderSession(gen.model, w, ge.layers, threads=args.threads, kv=kv, calibration_ids=calib)

        def new_loop(sess=None, session=session):
            return DecodeLoop(sess or session, eos, gen.tokenizer, max_batch=big, prefill_chunk=args.chunk)

        res_kv: dict = {"rows": {}}
        # prefill: B = 1, the prompt after R's memory
        loop = new_loop()
        pre = []
        for prep in preps[:6]:
            job = job_for(prep.prefix + prep.rest, prep.packed(gen, ge.layers, p.prior), sampling)
            t0 = time.perf_counter()
            prefill(loop, job)
            pre.append(time.perf_counter() - t0)
            loop.running.clear()
        res_kv["prefill_ms_median"] = round(1000 * statistics.median(pre[1:]), 2)
        for B in [int(x) for x in args.rows.split(",")]:
            loop = new_loop()
            for prep in preps[:B]:
                prefill(loop, job_for(prep.prefix + prep.rest, prep.packed(gen, ge.layers, p.prior), sampling))
            loop._step()  # bind
            res = _timed_steps(loop, args.steps)
            # ONNX Runtime's profile of a few more steps, in a session opened with profiling on
            sess = DecoderSession(gen.model, w, ge.layers, threads=args.threads, profile=True, kv=kv, calibration_ids=calib)
            ploop = new_loop(sess)
            for prep in preps[:B]:
                prefill(ploop, job_for(prep.prefix + prep.rest, prep.packed(gen, ge.layers, p.prior), sampling))
            for _ in range(args.ort_steps):
                ploop._step()
            so_path = sess.session.end_profiling()
            table = _op_table(so_path, args.ort_steps)
            os.unlink(so_path)
            total = sum(table.values())
            res["ort_profile_ms_per_step"] = {k: round(v / args.ort_steps, 2) for k, v in list(table.items())[:14]}
            res["ort_profile_total_ms_per_step"] = round(total / args.ort_steps, 2)
            res_kv["rows"][str(B)] = res
            print(w, kv, B, json.dumps(res), flush=True)
            del sess, ploop, loop
        out["by_config"][f"{w}/{kv}"] = res_kv
    first = out["by_config"]["/".join(configs[0])]
    out["rows"], out["prefill_ms_median"] = first["rows"], first["prefill_ms_median"]
    out["onnxruntime"] = ort.__version__
    _plot(out)
    return write("profile_decode", out)


def _plot(out: dict) -> None:
    from bench.common import plot_stacked

    ops = ["MatMulNBits", "MatMulIntegerToFloat", "GroupQueryAttention"]
    bars = []
    for c, v in out["by_config"].items():
        for B, r in v["rows"].items():
            table = {op: r["ort_profile_ms_per_step"].get(op, 0.0) for op in ops}
            table["other"] = max(0.0, r["step_ms_median"] - sum(table.values()))
            bars.append((f"{c}\n{B} rows", table))
    plot_stacked("profile_decode", bars, [*ops, "other"], "ms per decode step",
                 f"decode step by op type (k {out['k']}, {out['threads']} thread(s))")


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    main(["profile_decode", *sys.argv[1:]])
