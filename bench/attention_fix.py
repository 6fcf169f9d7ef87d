"""Before/after of the fused-attention fast path (issue 6), on identical real inputs, same run.

    python -m bench.attention_fix BEFORE.py [--calls 40] [--threads 1]

BEFORE.py is a previous softknn/attention.py (kept outside the repository, e.g.
`git show a2c0a24:softknn/attention.py > /tmp/attention_before.py`). The inputs are real: the
memory layer's q, k, v of real queries (bench/kb.py, ObliQA questions and Banking77 texts
alternating) and the K/V of their retrieved chunks from the 10k real bundle, for micro-batches
of 1, 4, 16 and 32 queries and k = 8 and 32. Both versions run interleaved on the same tensors;
every output field is compared (max |Δ|). Writes bench/results/attention_fix.json|png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch

from bench.common import RESULTS, write
from bench.kb import set_threads

FIELDS = ("out", "gate_in", "gate_mem", "p_mem", "lse_mem", "entropy", "entropy_in", "attn_mem")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,4,16,32")
    args = ap.parse_args()
    set_threads(args.threads)

    from bench.kb import device, queries, synthetic_bundle
    from softknn import attention as after
    from softknn.encoder import Encoder
    from softknn.engine import Engine, InferParams

    spec = importlib.util.spec_from_file_location("attention_before", args.before)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    engine = Engine(Encoder(device=device()), synthetic_bundle(10_000, "flat"))
    enc, rows, qs = engine.encoder, [], queries(64)
    for k in (8, 32):
        for B in [int(b) for b in args.batches.split(",")]:
            p = InferParams(k=k)
            texts = qs[:B]
            batch = enc.tokenize(texts)
            plain = enc.forward_plain(batch, keep_hidden=True)
            retr = engine.retrieve(plain.embedding.float().cpu().numpy(), engine.resolve([p] * B), batch.texts)
            memory = engine.bundle.kv.gather(retr.rows, retr.weights, enc.device)
            cap = {}

            def grab(q, kk, v, scaling, cap=cap):  # the memory layer's real q, k, v
                cap.update(q=q, k=kk, v=v, scaling=scaling)
                return after.fused_attention(q, kk, v, batch.mask, memory, torch.full((B,), p.alpha),
                                             torch.zeros(B, dtype=torch.bool), scaling).out

            enc.forward_fused(batch, engine.layer, grab, plain)
            for joint in (False, True):
                a = (cap["q"], cap["k"], cap["v"], batch.mask, memory, torch.full((B,), p.alpha),
                     torch.full((B,), joint), cap["scaling"])
                mem_b = before.MemoryBatch(memory.key, memory.value, memory.token_mask, memory.weight)
                b_args = a[:4] + (mem_b,) + a[5:]
                fb, fa = before.fused_attention(*b_args), after.fused_attention(*a)
                valid = batch.mask[:, None, :, None]  # compare non-pad query positions
                diff = {}
                for f in FIELDS:
                    x, y = getattr(fb, f), getattr(fa, f)
                    m = valid.reshape(B, 1, -1, *([1] * (x.dim() - 3))) if x.dim() >= 3 else None
                    d = (x - y).abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # −inf − −inf on empty slots
                    diff[f] = float((d * m).max()) if m is not None else float(d.max())
                tb, ta = [], []
                for _ in range(args.calls):
                    for fn, fa_, acc in ((before.fused_attention, b_args, tb), (after.fused_attention, a, ta)):
                        c0 = time.process_time()
                        fn(*fa_)
                        acc.append(time.process_time() - c0)
                S, Lm = memory.token_mask.shape[1:]
                rows.append({"k": k, "batch": B, "joint": joint, "T": int(batch.mask.shape[1]), "S": int(S), "Lm": int(Lm),
                             "before_cpu_ms": statistics.median(tb) * 1e3, "after_cpu_ms": statistics.median(ta) * 1e3,
                             "before_min_ms": min(tb) * 1e3, "after_min_ms": min(ta) * 1e3,
                             "speedup": statistics.median(tb) / statistics.median(ta), "max_abs_diff": diff})
                print(json.dumps({kk: v for kk, v in rows[-1].items() if kk != "max_abs_diff"}),
                      f"max|Δ| {max(diff.values()):.1e}", flush=True)
    write("attention_fix", {"command": f"python -m bench.attention_fix BEFORE.py --calls {args.calls} "
                                       f"--threads {args.threads} --batches {args.batches}", "rows": rows})
    plot(rows)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.2))
    labels = [f"B={r['batch']} k={r['k']}\n{'joint' if r['joint'] else 'fixed'}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["before_cpu_ms"] for r in rows], 0.4, label="before")
    ax.bar([i + 0.2 for i in x], [r["after_cpu_ms"] for r in rows], 0.4, label="after")
    for i, r in enumerate(rows):
        ax.text(i, r["before_cpu_ms"], f"{r['speedup']:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("CPU ms per call (median), log scale")
    ax.set_title("fused_attention before/after, real memory-layer inputs, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "attention_fix.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
