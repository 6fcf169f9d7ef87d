"""Out-of-scope refusal of a labelled KB's build-time abstain rule: Banking77 with intents left out of the KB, ObliQA as far-OOS.

    python -m bench oos_refusal [--splits 10] [--held-out 18] [--choose-splits 3] [--cache /tmp/oos_cache]
    python -m bench oos_refusal --seeds 0,2,4,6,8 --name part_a   # the same splits over two processes,
    python -m bench oos_refusal --seeds 1,3,5,7,9,full --name part_b
    python -m bench oos_refusal --merge part_a part_b             # then merged into oos_refusal.json

Each split (seed s) removes --held-out of the 77 intents from the KB: the KB is train.csv's rows of
the other intents, with the BM25 index the builder writes (LexicalIndex.build, the default
analyser) and the calibration the builder computes (softknn.retrieval.calibration.calibrate_loo, k 8,
m 200, 1% budget); queries are test.csv's rows, in scope where their intent is in the KB, out of
scope (near: same domain and style) where it is not, and the 2,288 ObliQA test questions
(obliqa_prepare's seeded split, seed 0) as far-OOS. Split "full" (run last) keeps every intent
(in-scope accuracy and far-OOS only). Embeddings: the default encoder (all-MiniLM-L6-v2, torch,
one thread), as the service embeds an input, cached in --cache.

Rules, each with its thresholds set on the KB alone (0.75 × 1% of leave-one-out accuracy):
- old: the rule before the cell choice: the best leave-one-out hybrid cell, s_min spending half
  the budget on s_1, t the rest (calibrate_rules);
- merged: calibrate_loo as it is (a hybrid cell only where it beats dense by 1 paired SE, then
  the same half share);
- alternatives at the merged cell: share_x (s_min spends share x of the budget, t the rest),
  s1_alone (s_min the whole budget, no t), score_alone (t the whole budget, no s_min), and
  pseudo_oos_share: the share of SHARES that refuses most leave-one-label-out pseudo
  out-of-scope queries of the KB (each labelled chunk, OOS_QUERIES sampled, against the KB
  without every chunk of its label), tried as the build-time default and not adopted: here
  only, the build does not run it.
Per split and rule: in-scope accuracy without abstention (dense 1-NN, dense k-NN, the cells), the
in-scope loss (accuracy − accuracy counting a refusal wrong), in-scope rejection, OOS refusal,
ObliQA refusal. Scores (split["scores"]): SCORES, each thresholded alone on leave-one-out at the
same budget against dense k-NN's correctness (τ 0.05). Splits 0..--choose-splits−1 are the ones
the rules were tried on; the summary reports the others.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.common import RESULTS, write
from softknn.retrieval.calibration import (
    BUDGET_MARGIN,
    calibrate_loo,
    calibrate_rules,
    choose_threshold,
    gate_thresholds,
    label_index,
    loo_outcomes,
    query_votes,
    refused,
)
from softknn.retrieval.lexical import LexicalIndex
from softknn.retrieval.scoring import CANDIDATES, DEFAULT_TEMPERATURE

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
NAME = "oos_refusal"
K = 8
TARGET = 0.01
BUDGET = BUDGET_MARGIN * TARGET
SHARES = (0.25, 0.5, 0.75, 1.0)  # the share of the budget s_min spends (the tried build-time grid)
OOS_QUERIES = 2_000  # leave-one-label-out queries per KB (a seeded sample), the chosen cell only
TOP = 64  # the nearest chunks the dense scores look at
SCORES = {  # name: what it is (dense, over the nearest chunks; "known" from the BM25 analyser)
    "s1": "the nearest chunk's similarity",
    "s2": "the 2nd nearest's similarity (deep-kNN: the k-th nearest)",
    "s4": "the 4th nearest's", "s8": "the 8th nearest's", "s32": "the 32nd nearest's",
    "mean8": "the mean similarity of the 8 nearest",
    "lse": "0.05·log Σ_32 exp((s_i − 1)/0.05): logsumexp of the 32 nearest",
    "label_0.02": "the top label score Σ_8 w·onehot, softmax τ 0.02", "label_0.05": "τ 0.05 (the engine's dense)",
    "label_0.1": "τ 0.1",
    "margin_0.05": "top label score − the second's, τ 0.05",
    "own2": "the predicted label's own 2nd nearest chunk's similarity (−1 beyond the 64 nearest)",
    "own4": "its 4th", "own8": "its 8th",
    "known": "the share of the query's BM25 terms some other KB chunk has",
    "s1_gate+known": "s_1 < s_min (half the budget) or known < t (the rest)",
}


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--splits", type=int, default=10, help="leave-intents-out splits (seeds 0..n−1)")
    p.add_argument("--held-out", type=int, default=18, help="intents left out of the KB per split")
    p.add_argument("--choose-splits", type=int, default=3, help="the first this many splits are the choosing ones")
    p.add_argument("--no-full", action="store_true", help="skip split 'full' (every intent in the KB)")
    p.add_argument("--cache", type=Path, default=Path("/tmp/oos_cache"), help="embedding cache (outside the repo)")
    p.add_argument("--name", default=NAME, help="result file name under bench/results")
    p.add_argument("--seeds", default=None, help="comma-separated split seeds (and 'full'), instead of --splits: "
                   "one part of a run split over processes")
    p.add_argument("--merge", nargs="+", default=None, metavar="PART",
                   help="only merge bench/results/PART.json files (runs of --seeds) into --name, then plot")


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
                from softknn.model.encoder import Encoder
                from softknn.params import Settings

                torch.set_num_threads(1)
                enc = Encoder(Settings().model.name, device="cpu")
            np.save(f, _embed(enc, t))
        out[name] = np.load(f)
        assert out[name].shape[0] == len(t), f"{f}: {out[name].shape[0]} rows for {len(t)} texts"
    return out


def old_record(loo: dict) -> tuple[tuple, float, float]:
    """The rule before the cell choice: the best hybrid cell by leave-one-out (ties to the smaller λ,
    then τ), calibrate_rules' gated thresholds."""
    acc = {key: float(v["ok"].mean()) for key, v in loo["cells"].items()}
    hybrid = [key for key in acc if key[0] == "hybrid"]
    cell = max(hybrid, key=lambda key: (acc[key], -key[1], -key[2]))
    c = loo["cells"][cell]
    g = calibrate_rules(c["score"], loo["s1"], c["ok"], BUDGET)["gated"]
    return cell, g["min_similarity"], g["threshold"]


def pseudo_oos(xb, label_ids, n_labels, texts, lex, cell, max_queries: int = OOS_QUERIES, seed: int = 0) -> dict:
    """Leave-one-label-out: each sampled labelled chunk against the KB without every chunk of its
    label (nobody can be right: a question about an intent the KB lacks). {"s1", "score"} (n,) at `cell`.
    BM25's statistics stay the whole KB's."""
    rows = np.flatnonzero(label_ids >= 0)
    if len(rows) > max_queries:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_queries, replace=False))
    all_ids = np.arange(len(xb))
    s1, score = [], []
    for start in range(0, len(rows), 256):
        block = rows[start : start + 256]
        dense = xb[block] @ xb.T  # (B, N)
        for j, c in enumerate(block):
            keep = label_ids != label_ids[c]  # (N,)
            d = dense[j][keep].astype(np.float64)
            b = lex.scores(lex.analyzer.terms(texts[c]))[keep].astype(np.float64)
            (_, sc), = query_votes(d, b, all_ids[keep], label_ids, n_labels, [cell], k=K, candidates=CANDIDATES).values()
            s1.append(float(d.max()))
            score.append(sc)
    return {"s1": np.asarray(s1), "score": np.asarray(score)}


def pseudo_oos_share(score, s1, ok, oos: dict) -> tuple[float, list[dict]]:
    """The share of SHARES whose thresholds (set on the in-scope leave-one-out outcomes) refuse most
    of `oos` (ties to the larger share), and each share's row."""
    table = []
    for share in SHARES:
        s_min, t = gate_thresholds(score, s1, ok, BUDGET, share)
        table.append({"share": share, "min_similarity": s_min, "threshold": t,
                      "pseudo_oos_refusal": float(refused(oos["score"], oos["s1"], s_min, t).mean())})
    return max(table, key=lambda r: (r["pseudo_oos_refusal"], r["share"]))["share"], table


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


def dense_scores(S: np.ndarray, label_ids: np.ndarray, n_labels: int) -> tuple[dict, np.ndarray]:
    """S (Q, N) similarities to the KB (−inf where a chunk is out). Returns ({score name: (Q,)} of
    SCORES' dense ones, the dense k-NN prediction at τ 0.05 (Q,))."""
    o = np.argpartition(-S, TOP - 1, axis=1)[:, :TOP]  # (Q, TOP)
    o = np.take_along_axis(o, np.argsort(-np.take_along_axis(S, o, 1), axis=1, kind="stable"), 1)
    top = np.take_along_axis(S, o, 1).astype(np.float64)  # (Q, TOP) descending
    lab = label_ids[o]  # (Q, TOP)
    f = {f"s{k}": top[:, k - 1] for k in (1, 2, 4, 8, 32)}
    f["mean8"] = top[:, :K].mean(1)
    f["lse"] = 0.05 * np.log(np.exp((top[:, :32] - 1) / 0.05).sum(1))
    rows = np.repeat(np.arange(len(S)), K)
    pred = np.zeros(len(S), dtype=np.int64)
    for tau in (0.02, 0.05, 0.1):
        w = np.exp((top[:, :K] - top[:, :1]) / tau)
        w /= w.sum(1, keepdims=True)  # (Q, K)
        acc = np.zeros((len(S), n_labels))
        np.add.at(acc, (rows, lab[:, :K].ravel()), w.ravel())
        srt = np.sort(acc, 1)
        f[f"label_{tau:g}"] = srt[:, -1]
        if tau == 0.05:
            f["margin_0.05"] = srt[:, -1] - srt[:, -2]
            pred = acc.argmax(1)
    cnt = np.cumsum(lab == pred[:, None], 1)  # (Q, TOP)
    for k in (2, 4, 8):
        f[f"own{k}"] = np.where(cnt[:, -1] >= k, top[np.arange(len(S)), np.argmax(cnt >= k, 1)], -1.0)
    return f, pred


def score_table(xb, label_ids, n_labels, texts, lex, q_emb, q_texts, truth, kinds) -> dict:
    """Each of SCORES thresholded alone on leave-one-out (dense k-NN correctness, the same budget):
    its threshold and test-side loss / OOS / far-OOS refusal."""
    S = xb @ xb.T  # (N, N)
    np.fill_diagonal(S, -np.inf)
    f_loo, pred_loo = dense_scores(S, label_ids, n_labels)
    del S
    ok_loo = pred_loo == label_ids
    f_q, pred_q = dense_scores(q_emb @ xb.T, label_ids, n_labels)
    ins = kinds == "in"
    ok_q = (pred_q == truth) & ins
    terms = [lex.analyzer.terms(t) for t in texts]
    df = Counter(w for t in terms for w in set(t))
    f_loo["known"] = np.array([sum(df[w] - 1 >= 1 for w in t) / max(1, len(t)) for t in terms])
    q_terms = [lex.analyzer.terms(t) for t in q_texts]
    f_q["known"] = np.array([sum(df[w] >= 1 for w in t) / max(1, len(t)) for t in q_terms])
    out: dict = {"loo_accuracy": float(ok_loo.mean()), "test_accuracy": float(ok_q[ins].mean())}

    def figures(ref):
        row = {"accuracy_loss": float(ok_q[ins].mean() - (ok_q & ~ref)[ins].mean())}
        for kind in ("oos", "far"):
            if (kinds == kind).any():
                row[f"{kind}_refusal"] = float(ref[kinds == kind].mean())
        return row

    for name in SCORES:
        if name == "s1_gate+known":
            s_min, t = gate_thresholds(f_loo["known"], f_loo["s1"], ok_loo, BUDGET)
            out[name] = {"min_similarity": s_min, "threshold": t, **figures(refused(f_q["known"], f_q["s1"], s_min, t))}
        else:
            t = choose_threshold(f_loo[name], ok_loo, BUDGET)
            out[name] = {"threshold": t, **figures(f_q[name] < t)}
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
    cell = (p["retrieval"], p.get("lexical_weight"), p["temperature"])
    dense_cell = ("dense", None, DEFAULT_TEMPERATURE["dense"])
    names, label_ids = label_index(labels)
    index_of = {x: i for i, x in enumerate(names)}
    t0 = time.perf_counter()
    pseudo = pseudo_oos(xb, label_ids, len(names), texts, lex, cell)
    t_pseudo = time.perf_counter() - t0
    q_texts = [t for t, _ in test] + far_texts
    q_emb = np.concatenate([emb["test"], emb["far"]])
    kinds = np.array(["in" if c not in removed else "oos" for _, c in test] + ["far"] * len(far_texts))
    truth = np.array([index_of.get(c, -2) for _, c in test] + [-2] * len(far_texts))
    cells = list(dict.fromkeys([dense_cell, old_cell, cell]))
    q = query_outcomes(xb, label_ids, len(names), lex, q_emb, q_texts, cells)
    ins = kinds == "in"
    c = loo["cells"][cell]
    rules = {"old": rule_figures(q, old_cell, old_smin, old_t, truth, kinds),
             "merged": rule_figures(q, cell, rec["min_similarity"], rec["abstain_threshold_gated"], truth, kinds)}
    for share in SHARES:
        rules[f"share_{share:g}"] = rule_figures(q, cell, *gate_thresholds(c["score"], loo["s1"], c["ok"], BUDGET, share),
                                                 truth, kinds)
    rules["s1_alone"] = rule_figures(q, cell, choose_threshold(loo["s1"], c["ok"], BUDGET), 0.0, truth, kinds)
    rules["score_alone"] = rule_figures(q, cell, -np.inf, rec["abstain_threshold"], truth, kinds)
    share, shares = pseudo_oos_share(c["score"], loo["s1"], c["ok"], pseudo)
    rules["pseudo_oos_share"] = {**rule_figures(q, cell, *gate_thresholds(c["score"], loo["s1"], c["ok"], BUDGET, share),
                                                truth, kinds), "share": share, "shares": shares}
    t0 = time.perf_counter()
    scores = score_table(xb, label_ids, len(names), texts, lex, q_emb, q_texts, truth, kinds)
    t_scores = time.perf_counter() - t0
    acc = {"dense_1nn": float((q["nn1"] == truth)[ins].mean()),
           "dense_knn": float((q["cells"][dense_cell][0] == truth)[ins].mean()),
           "old_cell": float((q["cells"][old_cell][0] == truth)[ins].mean()),
           "merged_cell": float((q["cells"][cell][0] == truth)[ins].mean())}
    loo_acc = {key: float(v["ok"].mean()) for key, v in loo["cells"].items()}
    paired = (q["cells"][old_cell][0] == truth)[ins].astype(float) - (q["cells"][dense_cell][0] == truth)[ins]
    return {"seed": seed, "removed": sorted(removed), "kb_rows": len(kb), "n_in": int(ins.sum()),
            "n_oos": int((kinds == "oos").sum()), "n_far": len(far_texts),
            "old_cell": list(old_cell), "merged_cell": list(cell), "test_accuracy": acc,
            "loo": {"dense": loo_acc[dense_cell], "old_cell": loo_acc[old_cell], "merged_cell": loo_acc[cell],
                    "cell_choice": rec["leave_one_out"]["cell_choice"]},
            "test_hybrid_minus_dense": {"diff": float(paired.mean()), "se": float(paired.std() / np.sqrt(len(paired)))},
            "rules": rules, "scores": scores,
            "seconds": {"loo_grid": t_loo, "calibrate_rest": t_rest, "pseudo_oos": t_pseudo, "scores": t_scores}}


def _mean_figures(rows: list[dict]) -> dict:
    out = {k: float(np.mean([x[k] for x in rows])) for k in ("accuracy_loss", "oos_refusal", "far_refusal")}
    out["max_accuracy_loss"] = float(max(x["accuracy_loss"] for x in rows))
    out["splits_over_1_point"] = int(sum(x["accuracy_loss"] > TARGET + 1e-12 for x in rows))
    return out


def summarise(splits: list[dict], choose: int) -> dict:
    rep = [s for s in splits if s["seed"] is not None and s["seed"] >= choose]
    out: dict = {"report_seeds": [s["seed"] for s in rep]}
    if not rep:
        return out
    out["rules"] = {rule: _mean_figures([s["rules"][rule] for s in rep]) for rule in rep[0]["rules"]}
    out["scores"] = {name: _mean_figures([s["scores"][name] for s in rep]) for name in SCORES}
    return out


def run(args) -> dict:
    train, test = _rows("train.csv"), _rows("test.csv")
    far_all = [q["Question"] for q in json.loads((DATA / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))]
    far_texts, far_rows = obliqa_test()
    emb = embeddings(args.cache, {"train": [t for t, _ in train], "test": [t for t, _ in test], "obliqa": far_all})
    emb["far"] = emb["obliqa"][far_rows]
    if args.merge:
        parts = [json.loads((RESULTS / f"{part}.json").read_text(encoding="utf-8")) for part in args.merge]
        splits = sorted((s for p in parts for s in p["splits"]), key=lambda s: (s["seed"] is None, s["seed"] or 0))
        payload = write(args.name, {"args": {k: str(v) for k, v in vars(args).items()},
                                    "parts": [p["args"] for p in parts], "scores": SCORES, "splits": splits,
                                    "summary": summarise(splits, args.choose_splits)})
        _plot(args.name, splits, args.choose_splits)
        return payload
    seeds: list[int | None] = ([None if x == "full" else int(x) for x in args.seeds.split(",")] if args.seeds
                               else list(range(args.splits)) + ([] if args.no_full else [None]))
    splits = []
    payload = {}
    for seed in seeds:
        t0 = time.perf_counter()
        s = run_split(seed, args.held_out, train, test, far_texts, emb)
        s["seconds"]["split"] = time.perf_counter() - t0
        splits.append(s)
        o, n = s["rules"]["old"], s["rules"]["merged"]
        print(f"split {seed}: cell old {s['old_cell']} merged {s['merged_cell']}; "
              f"loss {o['accuracy_loss']:.4f} -> {n['accuracy_loss']:.4f}, oos {o.get('oos_refusal', 0):.3f} -> "
              f"{n.get('oos_refusal', 0):.3f}, far {o['far_refusal']:.3f} -> {n['far_refusal']:.3f}; "
              f"acc {s['test_accuracy']}; {s['seconds']}", flush=True)
        payload = write(args.name, {"args": {k: str(v) for k, v in vars(args).items()}, "scores": SCORES,
                                    "splits": splits, "summary": summarise(splits, args.choose_splits)})
        _plot(args.name, splits, args.choose_splits)  # after every split: a cut-short run keeps its figures
    return payload


def _plot(name: str, splits: list[dict], choose: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = [s for s in splits if s["seed"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for rule, colour in (("old", "#C44E52"), ("merged", "#4C72B0")):
        xs = [s["rules"][rule]["accuracy_loss"] * 100 for s in rep]
        ys = [s["rules"][rule]["oos_refusal"] * 100 for s in rep]
        axes[0].scatter(xs, ys, color=colour, label=rule)
        for s, x, y in zip(rep, xs, ys, strict=True):
            axes[0].annotate(str(s["seed"]) + ("*" if s["seed"] < choose else ""), (x, y), fontsize=7)
    axes[0].axvline(1.0, color="grey", ls=":")
    axes[0].set(xlabel="in-scope accuracy loss (points)", ylabel="held-out-intent refusal (%)",
                title="per split (* = a choosing split)")
    axes[0].legend()
    reported = [s for s in rep if s["seed"] >= choose] or rep
    for rule in reported[0]["rules"]:
        x = np.mean([s["rules"][rule]["accuracy_loss"] for s in reported]) * 100
        y = np.mean([s["rules"][rule]["oos_refusal"] for s in reported]) * 100
        axes[1].scatter(x, y, color="#4C72B0")
        axes[1].annotate(rule, (x, y), fontsize=7)
    for name_ in SCORES:
        x = np.mean([s["scores"][name_]["accuracy_loss"] for s in reported]) * 100
        y = np.mean([s["scores"][name_]["oos_refusal"] for s in reported]) * 100
        axes[1].scatter(x, y, color="#55A868", marker="x")
        axes[1].annotate(name_, (x, y), fontsize=6, color="#2d6b3c")
    axes[1].axvline(1.0, color="grey", ls=":")
    axes[1].set(xlabel="mean in-scope loss (points)", ylabel="mean held-out-intent refusal (%)",
                title="reported splits: rules (blue) and single scores (green, dense k-NN)")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # python -m bench oos_refusal: the same as python -m bench.oos_refusal
    import sys

    from bench.__main__ import main

    main(["oos_refusal", *sys.argv[1:]])
