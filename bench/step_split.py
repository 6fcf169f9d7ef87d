"""Where the served decode step's time goes: the graph's segments (ONNX Runtime), the attention kernel and
the Python around them, at B = 1, 4, 16 rows, with w8a8's activation rounding in one QuantizeLinear (served)
beside the four ops it replaced.

The decode loop driven by hand (no HTTP), in-process, on the sample KB's test questions at k = 8: the
served runtime (`graph w8a8 int8 kernel`: the segments on `generator.threads`, 1, the kernel on the
machine's cores). Each rounding variant gets its own segments: `blocks`, the served graph (each row's
codes by one QuantizeLinear whose block is the row), and `ops`, the graph's reference rounding (Div,
Round, Add, Cast: the same codes, tests/core/test_decode_graph.py). For each variant and B, `--steps`
decode steps are timed with the segments' runs and the kernel's calls wrapped, in `--repeats` rounds
that alternate the variants (the VM's speed drifts by ~10% over minutes; the median of the rounds'
medians is reported). With `--ort-steps`, ONNX Runtime's own profile of that many steps at the largest
B, summed per op type over the 31 segments (a profiled session, after 4 steps that warm it: its
figures run high, and one variant's against the other's move by more than the timed steps do).

    python -m bench step_split [--rows 1,4,16] [--steps 32] [--repeats 3] [--rounding blocks,ops] [--ort-steps 4]

→ bench/results/step_split.json and step_split.png (ms per step: segments, kernel, Python, per variant and B).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

from bench.common import plot_stacked, speed_probe, write

ROOT = Path(__file__).resolve().parents[1]
VARIANT_CACHE = Path(os.environ.get("SOFTKNN_BENCH_CACHE", "/tmp/softknn-bench")) / "step-split-graphs"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per variant, B and round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds alternating the variants")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounding", default="blocks", help="w8a8 activation rounding variants (blocks: served; ops)")
    ap.add_argument("--lanes", default="0,1", help="lane variants: a step of 4 rows or more cut into this many "
                    "lanes (0: the served default, the cores; 1: none)")
    ap.add_argument("--ort-steps", type=int, default=4, help="steps of ONNX Runtime's profile at the largest B (0: none)")


class _Clock:
    """The segments' runs and the kernel's calls of one SplitDecoderSession timed (wrapped on the instance)."""

    def __init__(self, session):
        self.session, self.ort, self.kernel = session, 0.0, 0.0
        self._runs = [s.run_with_iobinding for s in session.sessions]
        self._attend = session.kernel.attend_raw
        self._main = threading.get_ident()

    def __enter__(self):
        clock = self

        class Timed:
            def __init__(self, inner, run):
                self.inner, self.run = inner, run

            def run_with_iobinding(self, *a):
                t0 = time.perf_counter()
                try:
                    return self.run(*a)
                finally:
                    if threading.get_ident() == clock._main:  # lane 0's (the decode thread's) only
                        clock.ort += time.perf_counter() - t0

            def __getattr__(self, name):
                return getattr(self.inner, name)

        def attend(*a, **kw):
            t0 = time.perf_counter()
            try:
                return self._attend(*a, **kw)
            finally:
                if threading.get_ident() == clock._main:
                    clock.kernel += time.perf_counter() - t0

        self.session.sessions = [Timed(s, r) for s, r in zip(self.session.sessions, self._runs, strict=True)]
        self.session.kernel.attend_raw = attend
        return self

    def __exit__(self, *exc):
        self.session.sessions = [s.inner for s in self.session.sessions]
        del self.session.kernel.attend_raw  # the class's method again
        return False


def _op_table(paths: list[str], last_runs: int) -> dict[str, float]:
    """ONNX Runtime's profiles of the segments → ms per op type over each session's last `last_runs` runs."""
    per: dict[str, float] = defaultdict(float)
    for path in paths:
        ev = json.loads(Path(path).read_text())
        runs = sorted(e["ts"] for e in ev if e.get("cat") == "Session" and e.get("name") == "model_run")
        since = runs[-last_runs]
        for e in ev:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= since:
                per[e["args"].get("op_name", "?")] += e["dur"] / 1000.0
        os.unlink(path)
    return {k: round(v / last_runs, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


def run(args: argparse.Namespace) -> dict:
    import onnxruntime as ort

    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models, msgs, setup_threads
    from softknn.generate import kernel
    from softknn.generate.batch import DecodeLoop, job_for
    from softknn.generate.engine import GenParams
    from softknn.generate.model import Sampling
    from softknn.generate.runtime import LANE_ROWS, SplitDecoderSession, cores, default_graph_cache

    setup_threads()
    enc, gen = models()
    bundle, _ = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    ge = gen_engine(enc, gen, bundle)
    rows = [int(x) for x in args.rows.split(",")]
    big = max(rows)
    qs = [q["question"] for q in load_qa() if q["split"] == "test"][:big]
    p = ge.resolve(GenParams(k=args.k, max_tokens=10_000))
    preps = [ge.prepare(p, None, msgs(q)) for q in qs]
    sampling = Sampling(max_tokens=max(args.steps, 2 * args.ort_steps + 4) + 8, temperature=0.0, stop=())
    kern, why = kernel.load(default_graph_cache())
    if kern is None:
        raise SystemExit(f"the attention kernel did not build: {why}")
    weights, calib = gen.weights("auto"), gen.calibration_ids()
    lanes = [int(x) or cores() for x in args.lanes.split(",")]
    combos = {f"{r}, {n} lane{'s' if n > 1 else ''}": (r, n) for r in args.rounding.split(",") for n in lanes}
    variants = list(combos)

    def session(variant: str, profile: bool = False) -> SplitDecoderSession:
        rounding, n = combos[variant]
        cache = None if rounding == "blocks" else VARIANT_CACHE
        return SplitDecoderSession(gen.model, weights, ge.layers, kern, calibration_ids=calib, rounding=rounding,
                                   cache_dir=cache, profile=profile, lanes=n)

    def filled(sess, B: int) -> DecodeLoop:
        loop = DecodeLoop(sess, set(), gen.tokenizer, max_batch=big, prefill_chunk=256)  # no EOS: every row decodes
        for prep in preps[:B]:
            loop.filling = loop._admit(job_for(prep.prefix + prep.rest, prep.packed(gen, ge.layers, p.prior), sampling))
            while loop.filling is not None:
                loop._prefill_chunk(loop.filling, 256)
        loop._step()  # bind
        return loop

    probe = {"start": speed_probe()}  # the machine's speed now (bench.common.speed_probe)
    sessions = {v: session(v) for v in variants}
    samples: dict[str, dict[int, list[dict]]] = {v: {B: [] for B in rows} for v in variants}
    for rnd in range(args.repeats):
        for v in variants if rnd % 2 == 0 else variants[::-1]:
            for B in rows:
                loop = filled(sessions[v], B)
                walls, segs, kerns = [], [], []
                with _Clock(sessions[v]) as clock:
                    for _ in range(args.steps):
                        clock.ort = clock.kernel = 0.0
                        t0 = time.perf_counter()
                        loop._step()
                        walls.append(time.perf_counter() - t0)
                        segs.append(clock.ort)
                        kerns.append(clock.kernel)
                med = {"step": statistics.median(walls), "segments": statistics.median(segs),
                       "kernel": statistics.median(kerns)}
                samples[v][B].append(med)
                print(f"round {rnd} {v} B={B}: " + ", ".join(f"{k} {1000 * x:.2f} ms" for k, x in med.items()), flush=True)
                del loop
    out: dict = {"command": args.command, "weights": weights, "k": args.k, "steps": args.steps, "repeats": args.repeats,
                 "kernel_threads": cores(), "segment_threads": 1, "onnxruntime": ort.__version__,
                 "memory_tokens_median": statistics.median(x.memory_tokens for x in preps), "lane_rows": LANE_ROWS,
                 "by_variant": {}}
    for v in variants:
        res = {}
        for B in rows:
            ms = {k: round(1000 * statistics.median(s[k] for s in samples[v][B]), 2) for k in ("step", "segments", "kernel")}
            ms["python"] = round(ms["step"] - ms["segments"] - ms["kernel"], 2)
            ms["rounds_step_ms"] = [round(1000 * s["step"], 2) for s in samples[v][B]]
            res[str(B)] = ms
        one = res[str(min(rows))]["step"]
        out["by_variant"][v] = {"rows": res, f"step_{big}_vs_{min(rows)}": round(res[str(big)]["step"] / one, 2)}
    if args.ort_steps > 0:
        for v in variants:
            sess = session(v, profile=True)
            loop = filled(sess, big)
            for _ in range(args.ort_steps + 4):  # the first runs of a fresh session warm it: the last ort_steps count
                loop._step()
            table = _op_table([s.end_profiling() for s in sess.sessions], args.ort_steps)
            out["by_variant"][v]["ort_profile_ms_per_step"] = {"rows": big, **table}
            print(v, "ORT profile", json.dumps(table), flush=True)
            del loop, sess
    probe["end"] = speed_probe()
    out["speed_probe"] = probe
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    _plot(out, rows)
    return write("step_split", out)


def _plot(out: dict, rows: list[int]) -> None:
    bars = [(f"{v}\n{B} rows", r["rows"][str(B)]) for v, r in out["by_variant"].items() for B in rows]
    plot_stacked("step_split", bars, ["segments", "kernel", "python"], "ms per decode step",
                 f"served decode step (k {out['k']}, kernel on {out['kernel_threads']} threads)",
                 totals=[ms["step"] for _, ms in bars])


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    main(["step_split", *sys.argv[1:]])
