"""Profile Engine.infer on one short input with pyinstrument; writes bench/results/profile_NAME.txt.

    python -m bench profile_infer [--size 100000] [--kind flat] [--k 8] [--calls 200] [--threads 0]

The KB is bench/kb.py's (real 10k bundle; synthetic beyond). The text tree shows where the time
of a fused forward goes; docs/benchmarks.md quotes its top lines.
"""

from __future__ import annotations

import argparse
import itertools

from bench.common import RESULTS
from bench.kb import set_threads


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--kind", default="flat")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--name", default=None)


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    from pyinstrument import Profiler

    from bench.kb import device, queries, synthetic_bundle
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder

    engine = Engine(Encoder(device=device()), synthetic_bundle(args.size, args.kind))
    p = InferParams(k=args.k)
    texts = queries(50)
    for q in texts[:5]:
        engine.infer([q], p)
    prof = Profiler(interval=0.0002)
    prof.start()
    for q in itertools.islice(itertools.cycle(texts), args.calls):
        engine.infer([q], p)
    prof.stop()
    name = args.name or f"profile_{args.size // 1000}k_{args.kind}_k{args.k}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.txt"
    header = f"python -m bench profile_infer --size {args.size} --kind {args.kind} --k {args.k} --calls {args.calls} --threads {args.threads}\n"
    out.write_text(header + prof.output_text(unicode=False, color=False))
    print(out.read_text()[:6000])
    return {"command": header.strip(), "profile": str(out)}


if __name__ == "__main__":  # python -m bench profile_infer: the same as python -m bench profile_infer
    import sys

    from bench.__main__ import main

    main(["profile_infer", *sys.argv[1:]])
