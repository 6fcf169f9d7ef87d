"""Model runtime, full pipeline: torch fp32 vs ONNX Runtime fp32 vs ONNX Runtime int8, in one run.

For one Banking77 KB and one ObliQA dev KB (fixed, seeded subsets: see SUBSETS, the same for every
variant; bench/memory_repr.py's banking77 / obliqa helpers), every variant builds its own bundle with
the production builder (softknn.index_builder.build_bundle, `softknn build`'s defaults: BM25 index written,
a labelled KB calibrated) through an Encoder of that runtime and precision, and is evaluated through
the served path exactly as `softknn eval` does it (softknn.evaluation.run.evaluate: the Engine's fused pass,
the settings' default parameters, so hybrid retrieval; --compare adds dense / lexical beside it):

  - Banking77: accuracy and macro-F1 of the served prediction, the baseline 1-NN, and the abstain
    rule's point (coverage, selective accuracy) at the bundle's calibrated threshold;
  - ObliQA dev (validation questions): nDCG@10, recall@10, MRR@10 of the evidence;
  - build seconds per bundle, and the export/verification of the ONNX graph (Encoder open);
  - max |Δ| of the fused embedding of `exact: true` answers (Engine.infer, default parameters)
    against the torch fp32 engine on its own bundle, over the first Q_DELTA queries of each set,
    and whether the top label / the evidence ids agree.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench runtime_pipeline     # writes bench/results/runtime_pipeline.{json,png}

Options: --threads (torch, ORT and FAISS threads; default 2), the subset sizes, --plot-only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import RESULTS, result_path, write
from bench.memory_repr import banking77, obliqa
from softknn.evaluation.run import evaluate
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.index_builder.reader import Fields
from softknn.infer.engine import Engine, InferParams
from softknn.model.encoder import Encoder
from softknn.params import InferDefaults
from softknn.storage.bundle import load_bundle

REPO = Path(__file__).resolve().parents[1]
OBLIQA = Path("/work/main/artifacts/eval/obliqa")  # kb.jsonl + questions_val.jsonl (bench/obliqa_prepare.py)
WORK = REPO / "artifacts" / "bench" / "runtime_pipeline"  # the built bundles (ignored by git)
SUBSETS = {"banking77_kb": 1500, "banking77_queries": 500, "obliqa_questions": 200, "obliqa_kb": 1000, "seed": 0}
VARIANTS = (("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8"))
Q_DELTA = 50


def name_of(runtime: str, precision: str) -> str:
    return f"{runtime}-{precision}"


def _strip_curves(rep: dict) -> dict:
    """The report without its per-threshold curves (they are what plots are drawn from, not figures)."""
    rep = json.loads(json.dumps(rep, default=str))
    rep.get("classification", {}).pop("curves", None)
    rep.get("evidence", {}).pop("curves", None)
    for row in rep.get("retrieval", {}).values():
        row.pop("recall_curve", None)
    return rep


def headline(rep: dict, labelled: bool) -> dict:
    """The figures the docs quote (in points, 100 = perfect)."""
    if labelled:
        c = rep["classification"]
        h = {"accuracy": 100 * c["softknn"]["accuracy"], "macro_f1": 100 * c["softknn"]["macro_f1"],
             "baseline_1nn_accuracy": 100 * c["baseline_1nn"]["accuracy"]}
        for rule, point in c["abstain"].get("softknn", {}).items():  # at the bundle's calibrated threshold
            h |= {f"abstain_{rule}_rejection_rate": 100 * point["rejection_rate"],
                  f"abstain_{rule}_answered_accuracy": 100 * (point["answered_accuracy"] or 0)}
        for mode, row in rep["retrieval"].items():
            h[f"{mode}_accuracy"] = 100 * row["classification"]["accuracy"]
    else:
        e = rep["evidence"]["softknn"]
        h = {"ndcg@10": 100 * e["ndcg@10"], "recall@10": 100 * e["recall@10"], "mrr@10": 100 * e["mrr@10"],
             "baseline_ndcg@10": 100 * rep["evidence"]["baseline"]["ndcg@10"]}
        for mode, row in rep["retrieval"].items():
            h[f"{mode}_ndcg@10"] = 100 * row["evidence"]["ndcg@10"]
    return {k: round(v, 3) for k, v in h.items()}


def deltas(engines: dict[str, Engine], texts: list[str], defaults: InferDefaults) -> dict:
    """max |Δ fused embedding| (exact: true, default parameters) against torch-fp32; label/evidence agreement."""
    params = InferParams.from_defaults(defaults, exact=True, truncate=True)
    ref = engines["torch-fp32"].infer(texts, params)
    e_ref = np.array([r.embedding for r in ref], dtype=np.float64)
    out = {}
    for name, eng in engines.items():
        got = ref if name == "torch-fp32" else eng.infer(texts, params)
        d = np.abs(np.array([r.embedding for r in got], dtype=np.float64) - e_ref).max(axis=1)  # per query
        cos = (np.array([r.embedding for r in got]) * e_ref).sum(1)
        out[name] = {"max_abs_delta": float(d.max()), "median_abs_delta": float(np.median(d)),
                     "min_cosine": float(cos.min()),
                     "same_prediction": sum(g.prediction == r.prediction for g, r in zip(got, ref, strict=True)),
                     "same_evidence": sum([e.chunk_id for e in g.evidence] == [e.chunk_id for e in r.evidence]
                                          for g, r in zip(got, ref, strict=True)),
                     "n": len(texts)}
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name_of(*v) for v in VARIANTS]
    colors = ["#4C72B0", "#55A868", "#C44E52"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    ds = res["datasets"]
    for ax, (d, metric, label) in zip(axes[:2], (("banking77", "accuracy", "Banking77 accuracy (%)"),
                                                  ("obliqa", "ndcg@10", "ObliQA dev nDCG@10 (×100)"))):
        if d not in ds:
            continue
        vals = [ds[d]["variants"][n]["quality"][metric] for n in names]
        ax.bar(names, vals, color=colors)
        for i, v in enumerate(vals):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=8)
        lo = min(vals)
        ax.set(ylim=(lo - 3, max(vals) + 1.5), ylabel=label, title=f"{d}: served path (hybrid)")
    x = np.arange(len(names))
    for j, d in enumerate(d for d in ("banking77", "obliqa") if d in ds):
        off = -0.2 + 0.4 * j
        axes[2].bar(x + off, [ds[d]["variants"][n]["build_s"] for n in names], 0.4, label=d)
        axes[3].bar(x + off, [max(ds[d]["variants"][n]["exact_delta"]["max_abs_delta"], 1e-9) for n in names], 0.4, label=d)
    axes[2].set(ylabel="seconds", title="bundle build time (shared 2-core box)")
    axes[3].set(yscale="log", ylabel="max |Δ fused embedding| vs torch fp32", title="exact: true answers (1e-9 = identical)")
    axes[3].axhline(1e-7, color="grey", ls=":", lw=1)
    for ax in axes[2:]:
        ax.set_xticks(x, names)
        ax.legend(fontsize=7)
    fig.suptitle("softknn model runtime, full pipeline (bench/runtime_pipeline.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=2, help="torch, ONNX Runtime and FAISS intra-op threads")
    for key, v in SUBSETS.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=v)
    ap.add_argument("--datasets", default="banking77,obliqa")
    ap.add_argument("--q-delta", type=int, default=Q_DELTA)
    ap.add_argument("--compare", default="hybrid", help="retrievals evaluated (the first is the default, hybrid; "
                    "`softknn eval` adds dense,lexical — each one more fused pass per query)")
    ap.add_argument("--out", default="runtime_pipeline", help="result name under bench/results/")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")


def run(args: argparse.Namespace) -> dict:
    if args.plot_only:
        res = json.loads((RESULTS / f"{args.out}.json").read_text())
        plot(res, RESULTS / f"{args.out}.png")
        return res
    import faiss

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    subsets = {k: getattr(args, k) for k in SUBSETS}
    WORK.mkdir(parents=True, exist_ok=True)
    defaults = InferDefaults()
    encoders, opened = {}, {}
    for runtime, precision in VARIANTS:
        t0 = time.perf_counter()
        enc = Encoder(runtime=runtime, precision=precision, threads=args.threads)
        opened[name_of(runtime, precision)] = {"open_s": round(time.perf_counter() - t0, 1),
                                               "verification": enc.onnx.verification if enc.onnx else None}
        encoders[name_of(runtime, precision)] = enc
        print(f"opened {name_of(runtime, precision)} in {opened[name_of(runtime, precision)]['open_s']} s", flush=True)
    res = {"command": "HF_HUB_OFFLINE=1 .venv/bin/" + args.command,
           "subsets": subsets, "compare": args.compare.split(","), "threads": args.threads, "q_delta": args.q_delta,
           "params": "InferDefaults() (hybrid where the bundle has BM25; the bundle's calibrated λ, τ, threshold)",
           "build": "BuildConfig defaults (lexical=True, calibrate=True), as `softknn build`",
           "encoders": opened, "datasets": {}}
    makers = {"banking77": (lambda w: banking77(w, subsets), Fields(), True),
              "obliqa": (lambda w: obliqa(w, subsets, OBLIQA), Fields(id="ID", text="Passage"), False)}
    for ds in args.datasets.split(","):
        make, fields, labelled = makers[ds]
        t_ds = time.perf_counter()
        kb, queries = make(WORK)
        engines, variants = {}, {}
        for name, enc in encoders.items():
            path = WORK / f"{ds}-{name}"
            t0 = time.perf_counter()
            m = build_bundle(kb, path, BuildConfig(fields=fields), enc, force=True, progress=False)
            build_s = round(time.perf_counter() - t0, 1)
            bundle = load_bundle(path, expected_fingerprint=enc.info.fingerprint)
            engines[name] = eng = Engine(enc, bundle)
            t0 = time.perf_counter()
            rep, _, _ = evaluate(eng, queries, InferParams.from_defaults(defaults), progress=False,
                                compare=args.compare.split(","))
            rep = _strip_curves(rep)
            variants[name] = {"build_s": build_s, "eval_s": round(time.perf_counter() - t0, 1),
                              "chunks": m["counts"]["chunks"], "tokens": m["counts"]["tokens"],
                              "model_manifest": {k: m["model"].get(k) for k in ("runtime", "precision")} if "model" in m else None,
                              "calibration": {k: (m.get("calibration") or {}).get(k) for k in ("abstain_threshold", "retrieval_defaults")},
                              "quality": headline(rep, labelled), "report": rep}
            print(f"  {ds} {name}: built in {build_s} s, eval {variants[name]['eval_s']} s: {variants[name]['quality']}",
                  flush=True)
        dl = deltas(engines, [q.text for q in queries[: args.q_delta]], defaults)
        ref = variants["torch-fp32"]["quality"]
        for name, v in variants.items():
            v["exact_delta"] = dl[name]
            v["quality_delta_vs_torch"] = {k: round(v["quality"][k] - ref[k], 3) for k in v["quality"]}
        res["datasets"][ds] = {"queries": len(queries), "chunks": variants["torch-fp32"]["chunks"],
                               "seconds": round(time.perf_counter() - t_ds, 1), "variants": variants}
        print(json.dumps({n: {"quality": v["quality"], "Δ": v["quality_delta_vs_torch"], "build_s": v["build_s"],
                              "max_abs_delta": v["exact_delta"]["max_abs_delta"]} for n, v in variants.items()}, indent=1),
              flush=True)
        write(args.out, res)  # after every dataset: a partial run still leaves its figures
    written = write(args.out, res)
    out = result_path(args.out)
    plot(res, RESULTS / f"{args.out}.png")
    print(f"wrote {out}")
    return written


if __name__ == "__main__":  # python -m bench runtime_pipeline: the same as python -m bench runtime_pipeline
    import sys

    from bench.__main__ import main

    main(["runtime_pipeline", *sys.argv[1:]])
