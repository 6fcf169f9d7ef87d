"""Out-of-scope refusal of a labelled KB's build-time abstain rule: Banking77 with intents left out of the KB, ObliQA as far-OOS.

    python -m bench oos_refusal [--splits 10] [--held-out 18] [--choose-splits 3] [--cache /tmp/oos_cache]

Each split (seed s) removes --held-out of the 77 intents from the KB: the KB is train.csv's rows of
the other intents, with the BM25 index the builder writes (LexicalIndex.build, the default
analyser) and the calibration the builder computes (softknn.calibration.calibrate_loo, k 8,
m 200, 1% budget); queries are test.csv's rows, in scope where their intent is in the KB, out of
scope (near: same domain and style) where it is not, and the 2,288 ObliQA test questions
(obliqa_prepare's seeded split, seed 0) as far-OOS. Split "full" keeps every intent (in-scope
accuracy and far-OOS only). Embeddings: the default encoder (all-MiniLM-L6-v2, torch, one thread),
as the service embeds an input, cached in --cache.

Rules, each with its thresholds set on the KB alone:
- old: the best leave-one-out hybrid cell, s_min spending half of 0.75 × 1% on s_1, t the rest;
- share_x: the same cell, s_min spending share x (the grid softknn.calibration.GATE_SHARES);
- new: calibrate_loo as it is (a hybrid cell only where it beats dense by 1 paired SE; the share
  whose thresholds refuse most leave-one-label-out queries of the KB).
Per split and rule: in-scope accuracy without abstention (dense 1-NN, dense k-NN, the cell), the
in-scope loss (accuracy − accuracy counting a refusal wrong), in-scope rejection, OOS refusal,
ObliQA refusal. Splits 0..--choose-splits−1 are the ones the rule was chosen on; the summary
reports the others. Timing: leave-one-out and the leave-one-label-out step, per split.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, write
from softknn.calibration import (
    BUDGET_MARGIN,
    GATE_SHARES,
    calibrate_loo,
    calibrate_rules,
    gate_thresholds,
    label_index,
    loo_outcomes,
    query_votes,
    refused,
)
from softknn.lexical import LexicalIndex
from softknn.retrieval import CANDIDATES, DEFAULT_TEMPERATURE

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
NAME = "oos_refusal"
K = 8
TARGET = 0.01


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--splits", type=int, default=10, help="leave-intents-out splits (seeds 0..n−1)")
    p.add_argument("--held-out", type=int, default=18, help="intents left out of the KB per split")
    p.add_argument("--choose-splits", type=int, default=3, help="the first this many splits are the choosing ones")
    p.add_argument("--no-full", action="store_true", help="skip split 'full' (every intent in the KB)")
    p.add_argument("--cache", type=Path, default=Path("/tmp/oos_cache"), help="embedding cache (outside the repo)")
    p.add_argument("--name", default=NAME, help="result file name under bench/results")


def _rows(name: str) -> list[tuple[str, str]]:
    with open(DATA / "banking77" / name, newline="", encoding="utf-8") as f:
        return [(r["text"], r["category"]) for r in csv.DictReader(f)]


def obliqa_test() -> tuple[list[str], np.ndarray]:
    """ObliQA's test questions (obliqa_prepare: seed 0, 500 validation questions out) and their rows."""
    qs = [q["Question"] for q in json.loads((DATA / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))]
    val = set(random.Random(0).sample(range(len(qs)), 500))
    rows = np.array([i for i in range(len(qs)) if i not in val])
    return [qs[i] for i in rows], rows


def embeddings(cache: Path, texts: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """{name: (n, D) float32} from cache/NAME.npy, encoding what is missing (one torch thread)."""
    cache.mkdir(parents=True, exist_ok=True)
    out, enc = {}, None
    for name, t in texts.items():
        f = cache / f"{name}.npy"
        if not f.exists():
            if enc is None:
                import torch

                from bench.question_words import _embed
                from softknn.encoder import Encoder
                from softknn.settings import Settings

                torch.set_num_threads(1)
                enc = Encoder(Settings().model.name, device="cpu")
            np.save(f, _embed(enc, t))
        out[name] = np.load(f)
        assert out[name].shape[0] == len(t), f"{f}: {out[name].shape[0]} rows for {len(t)} texts"
    return out


def old_record(loo: dict) -> tuple[tuple, float, float]:
    """The rule before: the best hybrid cell by leave-one-out, calibrate_rules' gated thresholds."""
    acc = {key: float(v["ok"].mean()) for key, v in loo["cells"].items()}
    hybrid = [key for key in acc if key[0] == "hybrid"]
    cell = max(hybrid, key=lambda key: (acc[key], -key[1], -key[2]))
    c = loo["cells"][cell]
    g = calibrate_rules(c["score"], loo["s1"], c["ok"], BUDGET_MARGIN * TARGET)["gated"]
    return cell, g["min_similarity"], g["threshold"]


def query_outcomes(xb, label_ids, n_labels, lex, q_emb, q_texts, cells) -> dict:
    """Test-side: per query, s_1, the dense 1-NN label and every cell's (label, score) over the whole KB."""
    s1, nn1 = np.zeros(len(q_texts)), np.zeros(len(q_texts), dtype=np.int64)
    votes: dict[tuple, list] = {c: [] for c in cells}
    ids = np.arange(len(xb))
    for start in range(0, len(q_texts), 256):
        dense = q_emb[start : start + 256] @ xb.T  # (B, N)
        for j in range(len(dense)):
            i = start + j
            d = dense[j].astype(np.float64)
            s1[i], nn1[i] = d.max(), label_ids[int(np.argmax(d))]
            b = lex.scores(lex.analyzer.terms(q_texts[i])).astype(np.float64)
            for c, v in query_votes(d, b, ids, label_ids, n_labels, cells, k=K, candidates=CANDIDATES).items():
                votes[c].append(v)
    return {"s1": s1, "nn1": nn1, "cells": {c: (np.array([t for t, _ in v]), np.array([s for _, s in v]))
                                           for c, v in votes.items()}}


def rule_figures(q: dict, cell, s_min: float, t: float, truth: np.ndarray, kinds: np.ndarray) -> dict:
    """In-scope accuracy / loss / rejection, OOS and far-OOS refusal of one (cell, s_min, t) on the test queries."""
    top, score = q["cells"][cell]
    ref = refused(score, q["s1"], s_min, t)
    ins = kinds == "in"
    ok = (top == truth) & ins
    out = {"min_similarity": s_min, "threshold": t, "accuracy": float(ok[ins].mean()),
           "accuracy_loss": float(ok[ins].mean() - (ok & ~ref)[ins].mean()),
           "in_scope_rejection": float(ref[ins].mean())}
    for kind in ("oos", "far"):
        if (kinds == kind).any():
            out[f"{kind}_refusal"] = float(ref[kinds == kind].mean())
    return out


def run_split(seed: int | None, n_out: int, train, test, far_texts, emb) -> dict:
    intents = sorted({c for _, c in train})
    removed = set() if seed is None else set(np.random.default_rng(seed).choice(intents, n_out, replace=False).tolist())
    kb = [i for i, (_, c) in enumerate(train) if c not in removed]
    xb = np.ascontiguousarray(emb["train"][kb])
    labels, texts = [train[i][1] for i in kb], [train[i][0] for i in kb]
    lex = LexicalIndex.build(texts)
    t0 = time.perf_counter()
    loo = loo_outcomes(xb, labels, texts, lex, k=K, candidates=CANDIDATES)
    t_loo = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec = calibrate_loo(xb, labels, texts, lex, k=K, candidates=CANDIDATES, outcomes=loo)
    t_rest = time.perf_counter() - t0
    old_cell, old_smin, old_t = old_record(loo)
    p = rec["params"]
    new_cell = (p["retrieval"], p.get("lexical_weight"), p["temperature"])
    dense_cell = ("dense", None, DEFAULT_TEMPERATURE["dense"])
    names, label_ids = label_index(labels)
    index_of = {x: i for i, x in enumerate(names)}
    q_texts = [t for t, _ in test] + far_texts
    q_emb = np.concatenate([emb["test"], emb["far"]])
    kinds = np.array(["in" if c not in removed else "oos" for _, c in test] + ["far"] * len(far_texts))
    truth = np.array([index_of.get(c, -2) for _, c in test] + [-2] * len(far_texts))
    cells = list(dict.fromkeys([dense_cell, old_cell, new_cell]))
    q = query_outcomes(xb, label_ids, len(names), lex, q_emb, q_texts, cells)
    ins = kinds == "in"
    c_old = loo["cells"][old_cell]
    rules = {"old": rule_figures(q, old_cell, old_smin, old_t, truth, kinds),
             "new": rule_figures(q, new_cell, rec["min_similarity"], rec["abstain_threshold_gated"], truth, kinds)}
    for share in GATE_SHARES:  # the old cell at every share: what the share alone does
        s_min, t = gate_thresholds(c_old["score"], loo["s1"], c_old["ok"], BUDGET_MARGIN * TARGET, share)
        rules[f"share_{share:g}"] = rule_figures(q, old_cell, s_min, t, truth, kinds)
    acc = {"dense_1nn": float((q["nn1"] == truth)[ins].mean()),
           "dense_knn": float((q["cells"][dense_cell][0] == truth)[ins].mean()),
           "old_cell": float((q["cells"][old_cell][0] == truth)[ins].mean()),
           "new_cell": float((q["cells"][new_cell][0] == truth)[ins].mean())}
    loo_acc = {key: float(v["ok"].mean()) for key, v in loo["cells"].items()}
    paired = (q["cells"][old_cell][0] == truth)[ins].astype(float) - (q["cells"][dense_cell][0] == truth)[ins]
    return {"seed": seed, "removed": sorted(removed), "kb_rows": len(kb), "n_in": int(ins.sum()),
            "n_oos": int((kinds == "oos").sum()), "n_far": len(far_texts),
            "old_cell": list(old_cell), "new_cell": list(new_cell), "test_accuracy": acc,
            "loo": {"dense": loo_acc[dense_cell], "old_cell": loo_acc[old_cell], "new_cell": loo_acc[new_cell],
                    "cell_choice": rec["leave_one_out"]["cell_choice"]},
            "test_hybrid_minus_dense": {"diff": float(paired.mean()), "se": float(paired.std() / np.sqrt(len(paired)))},
            "gate": rec["gate"], "rules": rules, "seconds": {"loo_grid": t_loo, "calibrate_rest": t_rest}}


def summarise(splits: list[dict], choose: int) -> dict:
    rep = [s for s in splits if s["seed"] is not None and s["seed"] >= choose]
    out = {"report_seeds": [s["seed"] for s in rep]}
    if not rep:
        return out
    for rule in rep[0]["rules"]:
        r = [s["rules"][rule] for s in rep]
        out[rule] = {k: float(np.mean([x[k] for x in r])) for k in ("accuracy_loss", "oos_refusal", "far_refusal")}
        out[rule]["max_accuracy_loss"] = float(max(x["accuracy_loss"] for x in r))
    return out


def run(args) -> dict:
    train, test = _rows("train.csv"), _rows("test.csv")
    far_all = [q["Question"] for q in json.loads((DATA / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))]
    far_texts, far_rows = obliqa_test()
    emb = embeddings(args.cache, {"train": [t for t, _ in train], "test": [t for t, _ in test], "obliqa": far_all})
    emb["far"] = emb["obliqa"][far_rows]
    seeds: list[int | None] = ([] if args.no_full else [None]) + list(range(args.splits))
    splits: list[dict] = []
    for seed in seeds:
        t0 = time.perf_counter()
        s = run_split(seed, args.held_out, train, test, far_texts, emb)
        s["seconds"]["split"] = time.perf_counter() - t0
        splits.append(s)
        o, n = s["rules"]["old"], s["rules"]["new"]
        print(f"split {seed}: cell old {s['old_cell']} new {s['new_cell']} share {s['gate']['share']}; "
              f"loss {o['accuracy_loss']:.4f} -> {n['accuracy_loss']:.4f}, oos {o.get('oos_refusal', 0):.3f} -> "
              f"{n.get('oos_refusal', 0):.3f}, far {o['far_refusal']:.3f} -> {n['far_refusal']:.3f}; "
              f"acc {s['test_accuracy']}; {s['seconds']}", flush=True)
        payload = write(args.name, {"args": {k: str(v) for k, v in vars(args).items()}, "splits": splits,
                                    "summary": summarise(splits, args.choose_splits)})
    _plot(args.name, splits, args.choose_splits)
    return payload


def _plot(name: str, splits: list[dict], choose: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = [s for s in splits if s["seed"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for rule, colour in (("old", "#C44E52"), ("new", "#4C72B0")):
        xs = [s["rules"][rule]["accuracy_loss"] * 100 for s in rep]
        ys = [s["rules"][rule]["oos_refusal"] * 100 for s in rep]
        axes[0].scatter(xs, ys, color=colour, label=rule)
        for s, x, y in zip(rep, xs, ys, strict=True):
            axes[0].annotate(str(s["seed"]) + ("*" if s["seed"] < choose else ""), (x, y), fontsize=7)
    axes[0].axvline(1.0, color="grey", ls=":")
    axes[0].set(xlabel="in-scope accuracy loss (points)", ylabel="held-out-intent refusal (%)",
                title="per split (* = a choosing split)")
    axes[0].legend()
    rules = [r for r in rep[0]["rules"] if r.startswith("share_")] + ["old", "new"]
    means = [np.mean([s["rules"][r]["oos_refusal"] for s in rep if s["seed"] >= choose]) * 100 for r in rules]
    axes[1].bar(rules, means, color="#55A868")
    axes[1].set(ylabel="mean OOS refusal, reported splits (%)", title="rules on the old cell vs old / new")
    axes[1].tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # python -m bench.oos_refusal: the same as python -m bench oos_refusal
    import sys

    from bench.__main__ import main

    main(["oos_refusal", *sys.argv[1:]])
