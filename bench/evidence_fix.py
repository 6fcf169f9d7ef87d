"""Before/after of the evidence.py performance fixes (issue 6), on identical inputs, same run.

    python -m bench.evidence_fix BEFORE.py [--calls 300] [--threads 1]

BEFORE.py is the previous softknn/evidence.py (kept outside the repository). Runs one real
Engine.infer pass on the 10k real bundle (bench/kb.py), then times evidence_items from both
modules interleaved on the same FusedResult, k = 8 and 32, and checks the outputs are identical.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch

from bench.common import write
from bench.kb import set_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="evidence_fix")
    args = ap.parse_args()
    set_threads(args.threads)

    from bench.kb import device, queries, synthetic_bundle
    from softknn import evidence as after
    from softknn.attention import fused_attention
    from softknn.encoder import Encoder
    from softknn.engine import Engine, InferParams

    spec = importlib.util.spec_from_file_location("evidence_before", args.before)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    engine = Engine(Encoder(device=device()), synthetic_bundle(10_000, "flat"))
    enc, rows = engine.encoder, []
    for k in (8, 32):
        p = InferParams(k=k)
        cases = []
        for q in queries(20):
            batch = enc.tokenize([q])
            plain = enc.forward_plain(batch, keep_hidden=True)
            retr = engine.retrieve(plain.embedding.float().cpu().numpy(), engine.resolve([p]), batch.texts)
            memory = engine.bundle.kv.gather(retr.rows, retr.weights, enc.device)
            cap = {}

            def fuse(qq, kk, vv, scaling, batch=batch, memory=memory, cap=cap):
                cap["fr"] = fused_attention(qq, kk, vv, batch.mask, memory, torch.tensor([p.alpha]), torch.tensor([False]), scaling)
                return cap["fr"].out

            enc.forward_fused(batch, engine.layer, fuse, plain)
            w = torch.zeros(cap["fr"].gate_mem.shape[-1])
            w[: len(retr.rows[0])] = torch.tensor(retr.weights[0])
            cases.append((cap["fr"], 0, batch, engine.bundle, retr.rows[0], retr.scores[0], w, p.alpha, False, 5, 5))
        same = all(before.evidence_items(*c) == after.evidence_items(*c) for c in cases)
        # not bit-identical: how far apart, and is everything but the floats (ids, spans, ranks,
        # chosen query tokens) the same?
        diffs = [_compare(before.evidence_items(*c), after.evidence_items(*c)) for c in cases]
        max_diff = max(d[0] for d in diffs)
        same_structure = all(d[1] for d in diffs)
        tb, ta = [], []
        for i in range(args.calls):
            c = cases[i % len(cases)]
            for mod, acc in ((before, tb), (after, ta)):
                c0 = time.process_time()
                mod.evidence_items(*c)
                acc.append(time.process_time() - c0)
        rows.append({"k": k, "identical_output": same, "same_apart_from_float_roundoff": same_structure,
                     "max_abs_float_diff": max_diff, "before_cpu_ms": statistics.median(tb) * 1e3,
                     "after_cpu_ms": statistics.median(ta) * 1e3, "speedup": statistics.median(tb) / statistics.median(ta)})
        print(json.dumps(rows[-1]), flush=True)
    write(args.name, {"command": f"python -m bench.evidence_fix BEFORE.py --calls {args.calls} --threads {args.threads} "
                                 f"--name {args.name}",
                           "rows": rows})


def _compare(a, b) -> tuple[float, bool]:
    """(largest |Δ| over all floats, True if everything that is not a float is equal)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b), True
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return 0.0, False
        parts = [_compare(a[k], b[k]) for k in a]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 0.0, False
        parts = [_compare(x, y) for x, y in zip(a, b, strict=True)]
    else:
        return 0.0, a == b
    return max((p[0] for p in parts), default=0.0), all(p[1] for p in parts)


if __name__ == "__main__":
    main()
