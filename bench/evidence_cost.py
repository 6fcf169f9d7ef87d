"""The evidence of one request: `Engine.result` by the fast path vs its plain reference, and their share of Engine.infer.

    python -m bench evidence_cost [--bundle DIR] [--queries 100] [--rounds 3] [--runtime onnx] [--threads 1]

On a bundle (default: bench/kb.py's real 10k bundle, `python -m bench kb`; the sample bundle with
`--bundle`), real queries one at a time, per parameter set (`CONFIGS`), interleaved per query:
    infer:  Engine.infer([q]) with the fast evidence (softknn.infer.evidence.evidence_items) and with the
            reference (evidence_items_reference), alternately;
    result: Engine.result alone on one fused pass captured per query, reference and fast alternately
            (the order swapped every round), wall and process CPU ms.
Every pair of answers is compared (same items, spans and query tokens; max |Δ| of the floats).
"""

from __future__ import annotations

import argparse
import time

from bench.common import RESULTS, percentile, write
from bench.kb import set_threads

CONFIGS = {  # name → InferParams fields; k 8, evidence 5, spans 5 is the default request
    "default (hybrid k8 ev5)": {},
    "dense k8 ev5": {"retrieval": "dense"},
    "hybrid k32 ev5": {"k": 32},
    "hybrid k32 ev32 spans20": {"k": 32, "evidence": 32, "spans": 20},
    "joint k8 ev5": {"mixing": "joint"},
}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bundle", default=None, help="bundle directory (default: bench/kb.py's real 10k bundle)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", default="onnx", help="model runtime of the plain forward (the service's default: onnx)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="evidence_cost")


def _capture(engine, text: str, p):
    """One request's fused pass, kept: what Engine.result reads (Engine._infer, then Engine.fuse)."""
    from softknn.model.attention import fused_attention

    enc = engine.encoder
    batch = enc.tokenize([text])
    plain = enc.forward_plain(batch, keep_hidden=True, capture_layer=engine.layer)
    retr = engine.retrieve(plain.embedding.float().cpu().numpy(), [p], [text])
    memory = engine.memory.gather(retr.rows, retr.weights, enc.device)
    alpha = torch_tensor([p.alpha], enc.device)
    joint = torch_tensor([p.mixing == "joint"], enc.device)
    cap = {}

    def fuse(q, k, v, scaling):
        cap["fr"] = fused_attention(q, k, v, batch.mask.to(enc.device), memory, alpha=alpha, joint=joint, scaling=scaling)
        return cap["fr"].out

    emb, tokens = enc.forward_fused(batch, engine.layer, fuse, plain)
    return (0, batch, cap["fr"], emb, tokens, retr, p, plain.embedding)


def torch_tensor(values, device):
    import torch

    return torch.tensor(values, device=device)


def _max_diff(a, b, path: str = "") -> float:
    """max |a − b| over the floats of two results' dicts; raises where anything else differs."""
    if isinstance(a, dict):
        if a.keys() != b.keys():
            raise AssertionError(f"{path}: keys differ")
        return max((_max_diff(a[k], b[k], f"{path}.{k}") for k in a), default=0.0)
    if isinstance(a, list):
        if len(a) != len(b):
            raise AssertionError(f"{path}: lengths differ")
        return max((_max_diff(x, y, path) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b)
    if a != b:
        raise AssertionError(f"{path}: {a!r} != {b!r}")
    return 0.0


def _timed(fn) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _stats(xs: list[float]) -> dict:
    return {"p50_ms": percentile(xs, 50) * 1e3, "p90_ms": percentile(xs, 90) * 1e3,
            "mean_ms": sum(xs) / len(xs) * 1e3, "n": len(xs)}


def measure(engine, reference_engine, texts: list[str], params, rounds: int) -> dict:
    p = engine.resolve([params])[0]
    cases = [_capture(engine, t, p) for t in texts]
    worst = 0.0
    for args in cases:  # the two paths agree (and warm the word cache, as a serving engine's is)
        worst = max(worst, _max_diff(engine.result(*args).to_dict(), engine.result(*args, reference=True).to_dict()))
    for t in texts[:3]:
        engine.infer([t], params)
        reference_engine.infer([t], params)
    acc: dict[str, list[float]] = {k: [] for k in ("result_fast", "result_reference", "result_fast_cpu",
                                                   "result_reference_cpu", "infer_fast", "infer_reference",
                                                   "infer_fast_cpu", "infer_reference_cpu")}
    for r in range(rounds):
        for i, (args, text) in enumerate(zip(cases, texts, strict=True)):
            pairs = [("fast", lambda a=args: engine.result(*a), lambda t=text: engine.infer([t], params)),
                     ("reference", lambda a=args: engine.result(*a, reference=True),
                      lambda t=text: reference_engine.infer([t], params))]
            if (r + i) % 2:
                pairs.reverse()
            for side, res, inf in pairs:
                w, c = _timed(res)
                acc[f"result_{side}"].append(w)
                acc[f"result_{side}_cpu"].append(c)
                w, c = _timed(inf)
                acc[f"infer_{side}"].append(w)
                acc[f"infer_{side}_cpu"].append(c)
    out = {k: _stats(v) for k, v in acc.items()}
    f, ref = out["result_fast_cpu"]["p50_ms"], out["result_reference_cpu"]["p50_ms"]
    out["speedup_cpu_p50"] = ref / f
    out["share_of_infer_cpu_p50"] = {"fast": f / out["infer_fast_cpu"]["p50_ms"],
                                     "reference": ref / out["infer_reference_cpu"]["p50_ms"]}
    out["max_abs_diff"] = worst
    return out


def _plot(name: str, results: dict, n_chunks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(results)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    for off, side, color in ((-0.2, "reference", "#DD8452"), (0.2, "fast", "#4C72B0")):
        v = [results[n][f"result_{side}_cpu"]["p50_ms"] for n in names]
        ax.bar(x + off, v, 0.4, label=side, color=color)
        for xi, vi in zip(x + off, v, strict=True):
            ax.text(xi, vi, f"{vi:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("Engine.result CPU ms, p50")
    ax.set_title(f"evidence per request: reference vs fast ({n_chunks} chunks, one thread)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)
    from bench.kb import bundle_path, queries
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder
    from softknn.storage.bundle import load_bundle

    class ReferenceEngine(Engine):
        """The engine with the evidence of evidence_items_reference."""

        def result(self, *a, **k):
            return super().result(*a, **k, reference=True)

    enc = Encoder(runtime=args.runtime, threads=args.threads or 1)
    path = args.bundle or str(bundle_path(10_000))
    bundle = load_bundle(path, expected_fingerprint=enc.info.fingerprint)
    engine, reference_engine = Engine(enc, bundle), ReferenceEngine(enc, bundle)
    texts = queries(args.queries)
    results = {}
    for name, fields in CONFIGS.items():
        results[name] = measure(engine, reference_engine, texts, InferParams(**fields), args.rounds)
        r = results[name]
        print(f"{name}: result CPU p50 {r['result_reference_cpu']['p50_ms']:.3f} → {r['result_fast_cpu']['p50_ms']:.3f} ms "
              f"({r['speedup_cpu_p50']:.2f}×); infer CPU p50 {r['infer_reference_cpu']['p50_ms']:.2f} → "
              f"{r['infer_fast_cpu']['p50_ms']:.2f} ms; share {r['share_of_infer_cpu_p50']['reference']:.1%} → "
              f"{r['share_of_infer_cpu_p50']['fast']:.1%}; max |Δ| {r['max_abs_diff']:.2e}", flush=True)
    cmd = (f"python -m bench evidence_cost{' --bundle ' + args.bundle if args.bundle else ''} --queries {args.queries} "
           f"--rounds {args.rounds} --runtime {args.runtime} --threads {args.threads} --name {args.name}")
    payload = write(args.name, {"command": cmd, "bundle": path, "chunks": len(bundle), "runtime": enc.info.runtime,
                                "configs": CONFIGS, "results": results})
    _plot(args.name, results, len(bundle))
    return payload


if __name__ == "__main__":  # python -m bench.evidence_cost: the same as python -m bench evidence_cost
    import sys

    from bench.__main__ import main

    main(["evidence_cost", *sys.argv[1:]])
