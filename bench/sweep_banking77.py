"""Choose softknn's defaults for labels and abstention on Banking77, on validation data only.

    python -m bench sweep_banking77 [--layers 5 3 1] [--out artifacts/eval/banking77/sweeps]

Two validation sets, both from the KB side (train.csv); test.csv is never read here:
  1. leave-one-out over the whole KB bundle (10,003 records, each searched against the others).
     Round one's label estimate is Nadaraya–Watson over w_db = kernel(s/τ) on the top k, a function
     of the similarities alone, so (k, τ, kernel) are swept exactly and cheaply from one FAISS
     search of the stored chunk embeddings (no model pass). Out-of-domain: the ObliQA validation
     questions (bench/obliqa_prepare.py), scored by the same rule against the whole KB.
  2. the stratified 10% held-out split (softknn.evaluation.holdout.prepare_validation: a bundle built from the
     other 90%), through the engine, for what needs the fused pass: α, mixing, memory layer (one
     bundle per layer), and the readouts that use the fused output (memory-mass labels in joint
     mode, a second retrieval round with the fused embedding).
Writes sweeps.json and PNG plots under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from softknn.evaluation.holdout import prepare_validation
from softknn.evaluation.metrics import abstain_point, auroc, choose_threshold
from softknn.evaluation.run import Strategy, read_queries, run_variants
from softknn.index_builder.reader import Fields
from softknn.infer.engine import Engine, InferParams
from softknn.model.attention import knn_weights
from softknn.model.encoder import Encoder
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "banking77"
BUNDLE = ROOT / "artifacts" / "eval" / "bundles" / "banking77"
OOD_VAL = ROOT / "artifacts" / "eval" / "obliqa" / "questions_val.jsonl"
KS = (1, 2, 3, 5, 8, 10, 16, 24, 32, 48)
TAUS = {"softmax": (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2),
        "epanechnikov": (0.2, 0.3, 0.4, 0.6, 0.8, 1.0), "uniform": (0.2, 0.3, 0.4, 0.6, 0.8, 1.0)}
TARGET_LOSS = 0.01


def nw_scores(D: np.ndarray, I: np.ndarray, y: np.ndarray, n_labels: int, k: int, tau: float, kernel: str) -> np.ndarray:
    """(n, C) label scores Σ_c w(c)·onehot(y_c) over the top k, w = kernel weights (the engine's w_db)."""
    D, I = D[:, :k], I[:, :k]
    w = knn_weights(torch.from_numpy(D), torch.from_numpy(I >= 0), tau, kernel).numpy().astype(np.float64)
    scores = np.zeros((len(D), n_labels))
    np.add.at(scores, (np.repeat(np.arange(len(D)), k), y[np.clip(I, 0, None)].ravel()), w.ravel())
    return scores


def top(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prediction (ties → the lower label index, i.e. the label sorted first, as the engine) and score."""
    return scores.argmax(1), scores.max(1)


def loo_sweep(bundle, xq_ood: np.ndarray) -> list[dict]:
    xb = np.ascontiguousarray(np.asarray(bundle.index.xb), dtype=np.float32)
    labels = sorted({c["label"] for c in bundle.chunks})
    y = np.array([labels.index(c["label"]) for c in bundle.chunks])
    docs = np.array([c["doc_id"] for c in bundle.chunks])
    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    kmax = max(KS)
    D, I = index.search(xb, kmax + 4)
    keep = docs[I] != docs[:, None]  # leave the query's own record out
    D = np.stack([d[m][:kmax] for d, m in zip(D, keep, strict=True)])
    I = np.stack([i[m][:kmax] for i, m in zip(I, keep, strict=True)])
    Do, Io = index.search(xq_ood, kmax)
    rows = []
    for kernel, taus in TAUS.items():
        for k in KS:
            for tau in taus:
                pred, s = top(nw_scores(D, I, y, len(labels), k, tau, kernel))
                ok = (pred == y) & (s > 0)
                _, so = top(nw_scores(Do, Io, y, len(labels), k, tau, kernel))
                t = choose_threshold(s, ok, TARGET_LOSS)
                rows.append({"kernel": kernel, "k": k, "temperature": tau, "accuracy": float(ok.mean()),
                             "threshold": t, **{f"val_{a}": b for a, b in abstain_point(s, ok, t).items() if a != "threshold"},
                             "ood_rejection_rate": float((so < t).mean()), "ood_auroc": auroc(s, so)})
    nn1 = float((y[I[:, 0]] == y).mean())
    for r in rows:
        r["nn1_accuracy"] = nn1
    return rows


def engine_variants() -> list[tuple[str, InferParams, Strategy]]:
    """One-at-a-time moves away from the current defaults, each read out in round one and round two.

    Round one's w_db labels depend on (k, τ, kernel) only, swept above; here what needs the fused pass.
    """
    base = dict(alpha=0.7, mixing="fixed", k=8, temperature=0.05, kernel="softmax")
    moves = [("base", {})]
    moves += [("alpha", {"alpha": a}) for a in (0.3, 0.9)]
    moves += [("mixing", {"mixing": "joint"})]
    moves += [("temperature", {"temperature": t}) for t in (0.02, 0.1)]
    out = []
    for name, mv in moves:
        p = InferParams(**{**base, **mv})
        out.append((name, p, Strategy()))
        out.append((name, p, Strategy(2, "fused")))
        out.append((name, p, Strategy(2, "sum")))
    return out


def engine_sweep(encoder, layers: list[int], out: Path) -> list[dict]:
    manifest = read_manifest(BUNDLE)
    rows = []
    for layer in layers:
        path, held = prepare_validation(DATA / "train.csv", Fields("id", "text", "category"), manifest,
                                        out.parent / "validation" / f"L{layer}", encoder, layer=layer)
        engine = Engine(encoder, load_bundle(path, expected_fingerprint=encoder.info.fingerprint))
        variants = engine_variants() if layer == manifest["memory_layer"] else [
            v for v in engine_variants() if v[0] in ("base", "mixing")]
        t0 = time.time()
        run = run_variants(engine, held, [(p, s) for _, p, s in variants], desc=f"layer {layer}")
        gold = [q.label for q in held]
        for (name, p, s), outs in zip(variants, run.outcomes, strict=True):
            rows.append({"layer": layer, "move": name, "alpha": p.alpha, "mixing": p.mixing, "k": p.k,
                         "temperature": p.temperature, "rounds": s.rounds, "requery": s.requery, "n": len(held),
                         "accuracy": float(np.mean([o["prediction"] == g for o, g in zip(outs, gold, strict=True)])),
                         "mass_accuracy": float(np.mean([o["mass_prediction"] == g for o, g in zip(outs, gold, strict=True)]))})
        print(f"layer {layer}: {len(variants)} variants in {time.time() - t0:.0f}s")
    return rows


def plot(loo: list[dict], eng: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, kernel in zip(axes, TAUS, strict=True):
        for tau in TAUS[kernel]:
            rs = [r for r in loo if r["kernel"] == kernel and r["temperature"] == tau]
            ax.plot([r["k"] for r in rs], [r["accuracy"] for r in rs], marker=".", label=f"τ={tau}")
        ax.axhline(loo[0]["nn1_accuracy"], color="k", ls="--", lw=1, label="plain 1-NN")
        ax.set_xscale("log")
        ax.set_xlabel("k")
        ax.set_ylabel("accuracy (leave-one-out over the KB)")
        ax.set_title(f"Nadaraya–Watson labels, {kernel} kernel")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "sweep_k_temperature.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    rs = [r for r in loo if r["kernel"] == "softmax"]
    for tau in TAUS["softmax"]:
        sub = [r for r in rs if r["temperature"] == tau]
        axes[0].plot([r["k"] for r in sub], [r["ood_rejection_rate"] for r in sub], marker=".", label=f"τ={tau}")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("k")
    axes[0].set_ylabel(f"OOD rejection at validation loss ≤ {TARGET_LOSS:.0%}")
    axes[0].set_title("abstain: ObliQA questions vs Banking77 KB (validation)")
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[1]
    layers = sorted({r["layer"] for r in eng})
    labels, vals = [], {}
    for r in eng:
        if r["move"] in ("base", "mixing") or r["layer"] == max(layers):
            key = f"L{r['layer']} {r['move']}={_moved(r)}"
            if key not in labels:
                labels.append(key)
            vals.setdefault(("round 1 (w_db)", key), r["accuracy"]) if r["rounds"] == 1 else None
            if r["rounds"] == 1 and r["mixing"] == "joint":
                vals[("round 1 (memory mass)", key)] = r["mass_accuracy"]
            if r["rounds"] == 2:
                vals[(f"round 2 ({r['requery']})", key)] = r["accuracy"]
    series = sorted({s for s, _ in vals})
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for j, s in enumerate(series):
        ax.bar(x + j * width, [vals.get((s, lab), np.nan) for lab in labels], width, label=s)
    ax.set_xticks(x + 0.4 - width / 2, labels, rotation=60, ha="right", fontsize=7)
    lo = min(v for v in vals.values()) - 0.01
    ax.set_ylim(lo, max(vals.values()) + 0.005)
    ax.set_ylabel("accuracy (10% held-out split)")
    ax.set_title("fused-pass readouts, one move at a time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sweep_engine.png", dpi=110)
    plt.close(fig)


def _moved(r: dict):
    return {"base": "", "alpha": r["alpha"], "mixing": r["mixing"], "k": r["k"], "temperature": r["temperature"]}[r["move"]]


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--layers", type=int, nargs="*", default=[5, 3, 1])
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "eval" / "banking77" / "sweeps")


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    encoder = Encoder()
    bundle = load_bundle(BUNDLE, expected_fingerprint=encoder.info.fingerprint)
    ood = read_queries(OOD_VAL, Fields("id", "text", None), None)
    xq_ood = encoder.st.encode([q.text for q in ood], convert_to_numpy=True, normalize_embeddings=True)
    loo = loo_sweep(bundle, np.ascontiguousarray(xq_ood, dtype=np.float32))
    eng = engine_sweep(encoder, args.layers, args.out)
    (args.out / "sweeps.json").write_text(json.dumps({"leave_one_out": loo, "engine": eng}, indent=1))
    plot(loo, eng, args.out)
    best = max(loo, key=lambda r: r["accuracy"])
    print("best leave-one-out:", best)
    return {"leave_one_out": loo, "engine": eng, "best_leave_one_out": best}


if __name__ == "__main__":  # python -m bench sweep_banking77: the same as python -m bench sweep_banking77
    import sys

    from bench.__main__ import main

    main(["sweep_banking77", *sys.argv[1:]])
