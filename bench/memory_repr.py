"""Compact memory: every memory representation side by side, in one run.

For one Banking77 KB and one ObliQA KB (fixed, seeded subsets: see SUBSETS), the same chunks are
built once per representation (kv = stored float32 K/V, the reference; hidden; hidden-fp16;
hidden-int8; recompute) and measured:

  - bytes per chunk of the memory files on disk (manifest sizes / chunks), and the ratio to kv;
  - p50 latency of Engine.infer for one short input at k = 8 and k = 32 (exact search, the arms
    interleaved round-robin so the shared box's load hits them alike);
  - max |Δ output| (fused embedding, exact: true, k = 8 and 32) against kv, over Q_DELTA queries;
  - quality: Banking77 accuracy (the served prediction, the memory-mass readout and the two-round
    requery with the fused embedding — the last two read the memory) and ObliQA dev nDCG@10 /
    recall@10 of the evidence order (memory-mass) and of the requery, softknn.evaluation's metrics,
    for every arm.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench memory_repr        # writes bench/results/memory_repr.{json,png}

`--quick`: the packaged sample KB instead (softknn/sample_kb, built as `softknn build` builds it:
lexical index and calibration included), kv and hidden (the default) only unless --kinds says
otherwise: each whole bundle's size on disk (`du -sb`) and its memory files', and the max |Δ| over
every number of the exact answers (`exact: true`, dense and hybrid, k = 8 and 32) to those of kv
for the sample queries, with whether every id, label and order is the same; a p50 at k = 8.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench memory_repr --quick  # → bench/results/memory_repr_quick.{json,png}

Targets: hidden ≥ 2× fewer bytes than kv with |Δ| ≤ 1e-5; the best lossy ≥ 8× fewer
with |Δ| ≤ 1e-3 and quality within 0.1 point of kv.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import RESULTS, result_path, write
from softknn.evaluation.metrics import classification_metrics, retrieval_metrics
from softknn.evaluation.run import Query, Strategy, run_variants
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.index_builder.reader import Fields
from softknn.infer.engine import Engine, InferParams
from softknn.model.encoder import Encoder
from softknn.storage.bundle import load_bundle
from softknn.storage.memory_stores import MEMORY_KINDS

REPO = Path(__file__).resolve().parents[1]
DATA = Path("/work/shared/data")
OBLIQA = REPO / "artifacts-main" / "eval" / "obliqa"  # kb.jsonl + questions_val.jsonl (bench/obliqa_prepare.py)
WORK = REPO / "artifacts" / "bench" / "memory_repr"  # the built bundles (ignored by git)
SUBSETS = {"banking77_kb": 2000, "banking77_queries": 400, "obliqa_questions": 100, "obliqa_kb": 500, "seed": 0}
Q_DELTA = 32
SHORT = "I lost my card, can you block it?"
KS = (8, 32)


def banking77(work: Path, subsets: dict = SUBSETS) -> tuple[Path, list[Query]]:
    """Seeded random banking77_kb train texts (the KB) and banking77_queries test texts (the queries)."""
    rng = random.Random(subsets["seed"])
    with open(DATA / "banking77" / "train.csv", newline="") as f:
        train = list(csv.DictReader(f))
    with open(DATA / "banking77" / "test.csv", newline="") as f:
        test = list(csv.DictReader(f))
    kb = sorted(rng.sample(range(len(train)), subsets["banking77_kb"]))
    qs = sorted(rng.sample(range(len(test)), subsets["banking77_queries"]))
    path = work / "banking77.jsonl"
    path.write_text("".join(json.dumps({"id": f"tr{i}", "text": train[i]["text"], "label": train[i]["category"]}) + "\n"
                            for i in kb))
    return path, [Query(f"te{i}", test[i]["text"], test[i]["category"]) for i in qs]


def obliqa(work: Path, subsets: dict = SUBSETS, root: Path = OBLIQA) -> tuple[Path, list[Query]]:
    """The first N dev questions' gold passages plus seeded other passages, up to obliqa_kb."""
    rng = random.Random(subsets["seed"])
    questions = [json.loads(x) for x in (root / "questions_val.jsonl").read_text().splitlines() if x.strip()]
    questions = questions[: subsets["obliqa_questions"]]
    passages = [json.loads(x) for x in (root / "kb.jsonl").read_text().splitlines() if x.strip()]
    gold = {g for q in questions for g in q["gold_ids"]}
    keep = [p for p in passages if p["ID"] in gold]
    rest = [p for p in passages if p["ID"] not in gold]
    keep += rng.sample(rest, max(0, subsets["obliqa_kb"] - len(keep)))
    keep.sort(key=lambda p: p["ID"])
    path = work / "obliqa.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in keep))
    return path, [Query(q["id"], q["text"], None, list(q["gold_ids"])) for q in questions]


def build_all(enc: Encoder, kb: Path, name: str, fields: Fields, work: Path) -> dict[str, dict]:
    out = {}
    for kind in MEMORY_KINDS:
        path = work / f"{name}-{kind}"
        t0 = time.perf_counter()
        m = build_bundle(kb, path, BuildConfig(memory=kind, fields=fields, lexical=False, calibrate=False), enc,
                         force=True, progress=False)
        bundle = load_bundle(path)
        mem = bundle.summary()["memory"]
        out[kind] = {"path": path, "engine": Engine(enc, bundle), "build_s": round(time.perf_counter() - t0, 1),
                     "memory_bytes": mem["bytes"], "memory_bytes_per_chunk": mem["bytes_per_chunk"],
                     "bundle_bytes_per_chunk": round(sum(f["bytes"] for f in m["files"].values()) / m["counts"]["chunks"], 1),
                     "chunks": m["counts"]["chunks"], "tokens": m["counts"]["tokens"]}
        print(f"  {name} {kind}: {mem['bytes_per_chunk']} B/chunk, built in {out[kind]['build_s']} s", flush=True)
    return out


def latency(arms: dict[str, dict], repeats: int) -> dict:
    """p50 ms of Engine.infer([SHORT]) per arm and k, the arms interleaved round-robin."""
    times = {kind: {k: [] for k in KS} for kind in arms}
    for a in arms.values():  # warm-up
        a["engine"].infer([SHORT], [InferParams(k=KS[0], exact=True)])
    for _ in range(repeats):
        for k in KS:
            for kind, a in arms.items():
                t0 = time.perf_counter()
                a["engine"].infer([SHORT], [InferParams(k=k, exact=True)])
                times[kind][k].append(1000 * (time.perf_counter() - t0))
    return {kind: {f"p50_ms_k{k}": round(statistics.median(v), 2) for k, v in t.items()} for kind, t in times.items()}


def deltas(arms: dict[str, dict], texts: list[str]) -> dict:
    """max |Δ fused embedding| against kv, exact: true, at each k; and whether the evidence ids agree."""
    out = {kind: {} for kind in arms}
    for k in KS:
        params = [InferParams(k=k, exact=True, evidence=k)] * len(texts)
        ref = arms["kv"]["engine"].infer(texts, params)
        e_ref = np.array([r.embedding for r in ref])
        for kind, a in arms.items():
            got = ref if kind == "kv" else a["engine"].infer(texts, params)
            out[kind][f"max_abs_delta_k{k}"] = float(np.abs(np.array([r.embedding for r in got]) - e_ref).max())
            out[kind][f"same_evidence_k{k}"] = all([e.chunk_id for e in g.evidence] == [e.chunk_id for e in r.evidence]
                                                   for g, r in zip(got, ref, strict=True))
    for kind in arms:
        out[kind]["max_abs_delta"] = max(out[kind][f"max_abs_delta_k{k}"] for k in KS)
    return out


def quality(arms: dict[str, dict], queries: list[Query], labelled: bool) -> dict:
    """softknn.evaluation over the queries: the served readout and the two-round requery, per arm."""
    out = {}
    variants = [(InferParams(retrieval="dense"), Strategy()), (InferParams(retrieval="dense"), Strategy(rounds=2))]
    for kind, a in arms.items():
        t0 = time.perf_counter()
        run = run_variants(a["engine"], queries, variants, depth=10, progress=False)
        one, two = run.outcomes
        if labelled:
            gold = [q.label for q in queries]
            out[kind] = {"accuracy": 100 * classification_metrics(gold, [o["prediction"] for o in one])["accuracy"],
                         "mass_accuracy": 100 * classification_metrics(gold, [o["mass_prediction"] for o in one])["accuracy"],
                         "requery_accuracy": 100 * classification_metrics(gold, [o["prediction"] for o in two])["accuracy"]}
        else:
            gold = [q.gold for q in queries]
            m1 = retrieval_metrics([o["ranked"] for o in one], gold, (10,), 10)
            m2 = retrieval_metrics([o["ranked"] for o in two], gold, (10,), 10)
            out[kind] = {"ndcg@10": 100 * m1["ndcg@10"], "recall@10": 100 * m1["recall@10"],
                         "requery_ndcg@10": 100 * m2["ndcg@10"], "requery_recall@10": 100 * m2["recall@10"]}
        out[kind] = {k: round(v, 3) for k, v in out[kind].items()} | {"eval_s": round(time.perf_counter() - t0, 1)}
        print(f"  quality {kind}: {out[kind]}", flush=True)
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(MEMORY_KINDS)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ds, color in (("obliqa", "#4C72B0"), ("banking77", "#DD8452")):
        r = res["datasets"][ds]["arms"]
        x = np.arange(len(kinds)) + (0.2 if ds == "banking77" else -0.2)
        axes[0].bar(x, [max(r[k]["memory_bytes_per_chunk"], 1) for k in kinds], 0.4, label=ds, color=color)
        for i, k in enumerate(kinds):
            axes[0].annotate("0 B" if not r[k]["memory_bytes_per_chunk"] else f"{r[k]['ratio_vs_kv']}×", (x[i], max(r[k]["memory_bytes_per_chunk"], 1)),
                             ha="center", va="bottom", fontsize=7)
        for j, kk in enumerate(KS):
            axes[1].plot(kinds, [r[k][f"p50_ms_k{kk}"] for k in kinds], marker="o", ls="-" if j == 0 else "--",
                         color=color, label=f"{ds} k={kk}")
        axes[2].bar(x, [max(r[k]["max_abs_delta"], 1e-9) for k in kinds], 0.4, color=color, label=ds)
    axes[0].set(yscale="log", ylabel="memory bytes per chunk (log)", title="memory on disk (ratio to kv)")
    axes[1].set(yscale="log", ylabel="p50 ms, one short input (log)", title="Engine.infer latency (exact search)")
    axes[2].set(yscale="log", ylabel="max |Δ fused embedding| vs kv", title="output difference (1e-9 = exact)")
    axes[2].axhline(1e-5, color="grey", ls=":", lw=1)
    axes[2].axhline(1e-3, color="grey", ls="--", lw=1)
    for ax in axes:
        ax.set_xticks(range(len(kinds)), kinds, rotation=20)
        ax.legend(fontsize=7)
    fig.suptitle("softknn memory representations (bench/memory_repr.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=int, default=11, help="latency samples per arm and k")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    ap.add_argument("--quick", action="store_true", help="the sample KB: bundle sizes (du -sb) and exact-answer "
                                                       "|Δ| to kv on the sample queries (memory_repr_quick.json)")
    ap.add_argument("--kinds", default="kv,hidden", help="with --quick: the memory kinds (kv always, the reference)")


# --- --quick: the sample KB ----------------------------------------------------------------------
SAMPLE = REPO / "softknn" / "sample_kb"
QUICK_WORK = REPO / "artifacts" / "bench" / "memory_repr_quick"


def du_bytes(path: Path) -> int:
    """`du -sb PATH`: the bundle's apparent size on disk, every file and folder."""
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def leaf_delta(a, b, where: str = "") -> tuple[float, list[str]]:
    """(max |a − b| over every float of two JSON answers, the paths where anything else differs:
    an id, a label, a list's length, a key, an integer)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            return 0.0, [f"{where}: keys {sorted(a)} vs {sorted(b)}"]
        parts = [leaf_delta(a[k], b[k], f"{where}.{k}") for k in a]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 0.0, [f"{where}: {len(a)} items vs {len(b)}"]
        parts = [leaf_delta(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    elif isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
        return abs(a - b), []
    else:
        return 0.0, [] if a == b else [f"{where}: {a!r} vs {b!r}"]
    return max((d for d, _ in parts), default=0.0), [m for _, ms in parts for m in ms]


def run_quick(args: argparse.Namespace) -> dict:
    kinds = ["kv", *[k for k in args.kinds.split(",") if k and k != "kv"]]
    for k in kinds:
        if k not in MEMORY_KINDS:
            raise SystemExit(f"--kinds: {k!r} is not one of {MEMORY_KINDS}")
    torch.set_num_threads(args.threads)
    QUICK_WORK.mkdir(parents=True, exist_ok=True)
    enc = Encoder()
    texts = [json.loads(x)["text"] for f in ("queries.jsonl", "ood_queries.jsonl")
             for x in (SAMPLE / f).read_text().splitlines() if x.strip()]
    arms = {}
    for kind in kinds:
        path = QUICK_WORK / kind
        t0 = time.perf_counter()
        m = build_bundle(SAMPLE / "kb", path, BuildConfig(memory=kind), enc, force=True, progress=False)
        mem = load_bundle(path).summary()["memory"]
        arms[kind] = {"engine": Engine(enc, load_bundle(path)), "build_s": round(time.perf_counter() - t0, 1),
                      "du_sb_bytes": du_bytes(path), "memory_files": mem["files"], "memory_bytes": mem["bytes"],
                      "memory_bytes_per_chunk": mem["bytes_per_chunk"], "chunks": m["counts"]["chunks"],
                      "tokens": m["counts"]["tokens"], "docs": m["counts"]["docs"]}
        print(f"  sample {kind}: du -sb {arms[kind]['du_sb_bytes']:,} B, memory {mem['bytes']:,} B", flush=True)
    cases = [(r, k) for r in ("dense", "hybrid") for k in KS]
    ref = {c: [x.to_dict() for x in arms["kv"]["engine"].infer(texts, [InferParams(retrieval=c[0], k=c[1], exact=True)] * len(texts))]
           for c in cases}
    lat = {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up
        arms[kind]["engine"].infer(texts[:1], [InferParams(k=KS[0], exact=True)])
    for _ in range(args.repeats):
        for kind, a in arms.items():
            t0 = time.perf_counter()
            a["engine"].infer(texts[:1], [InferParams(k=KS[0], exact=True)])
            lat[kind].append(1000 * (time.perf_counter() - t0))
    out = {}
    kv_du, kv_mem = arms["kv"]["du_sb_bytes"], arms["kv"]["memory_bytes"]
    for kind, a in arms.items():
        per_case, mismatches = {}, []
        for c in cases:
            got = ref[c] if kind == "kv" else [x.to_dict() for x in a["engine"].infer(texts, [InferParams(retrieval=c[0], k=c[1], exact=True)] * len(texts))]
            d, ms = leaf_delta(got, ref[c])
            per_case[f"{c[0]}_k{c[1]}"] = d
            mismatches += [f"{c[0]} k={c[1]}{m}" for m in ms]
        out[kind] = {k: v for k, v in a.items() if k != "engine"} | {
            "du_sb_ratio_vs_kv": round(kv_du / a["du_sb_bytes"], 3),
            "memory_ratio_vs_kv": round(kv_mem / a["memory_bytes"], 3) if a["memory_bytes"] else None,
            "max_abs_delta_by_case": per_case, "max_abs_delta": max(per_case.values()),
            "non_float_mismatches": mismatches[:20], "same_ids_labels_and_order": not mismatches,
            "p50_ms_k8": round(statistics.median(lat[kind]), 2)}
    res = {"mode": "quick", "kb": "softknn/sample_kb/kb", "queries": len(texts),
           "query_files": ["queries.jsonl", "ood_queries.jsonl"], "ks": list(KS), "retrievals": ["dense", "hybrid"],
           "arms": out}
    print(json.dumps({k: {m: v[m] for m in ("du_sb_bytes", "du_sb_ratio_vs_kv", "memory_bytes", "max_abs_delta",
                                            "same_ids_labels_and_order", "p50_ms_k8")} for k, v in out.items()}, indent=1))
    written = write("memory_repr_quick", res)
    plot_quick(written, RESULTS / "memory_repr_quick.png")
    print(f"wrote {result_path('memory_repr_quick')}")
    return written


def plot_quick(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = res["arms"]
    kinds = list(arms)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(len(kinds))
    rest = [arms[k]["du_sb_bytes"] - arms[k]["memory_bytes"] for k in kinds]
    mem = [arms[k]["memory_bytes"] for k in kinds]
    axes[0].bar(x, [r / 1e6 for r in rest], 0.6, label="everything else", color="#8C8C8C")
    axes[0].bar(x, [m / 1e6 for m in mem], 0.6, bottom=[r / 1e6 for r in rest], label="memory files", color="#4C72B0")
    for i, k in enumerate(kinds):
        axes[0].annotate(f"{arms[k]['du_sb_bytes'] / 1e6:.2f} MB ({arms[k]['du_sb_ratio_vs_kv']}×)",
                         (x[i], arms[k]["du_sb_bytes"] / 1e6), ha="center", va="bottom", fontsize=8)
    axes[0].set(ylabel="MB (du -sb)", title=f"sample bundle on disk ({arms['kv']['chunks']} chunks)")
    axes[0].legend(fontsize=8)
    cases = list(arms[kinds[0]]["max_abs_delta_by_case"])
    w = 0.8 / len(cases)
    for j, c in enumerate(cases):
        xs, ds = x + (j - (len(cases) - 1) / 2) * w, [arms[k]["max_abs_delta_by_case"][c] for k in kinds]
        axes[1].bar(xs, [max(d, 1e-12) for d in ds], w, label=c)
        for xi, d in zip(xs, ds, strict=True):
            axes[1].annotate("0" if d == 0 else f"{d:.1e}", (xi, max(d, 1e-12)), ha="center", va="bottom", fontsize=7)
    axes[1].axhline(1e-4, color="grey", ls="--", lw=1, label="contract 1e-4")
    axes[1].set(yscale="log", ylim=(1e-13, 1e-2), ylabel="max |Δ| over every answer number vs kv",
                title=f"exact answers, {res['queries']} sample queries (0: bit-identical)")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(x, kinds)
    fig.suptitle("softknn sample KB: memory kv vs hidden (bench/memory_repr.py --quick)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> dict:
    if args.quick and args.plot_only:
        res = json.loads((RESULTS / "memory_repr_quick.json").read_text())
        plot_quick(res, RESULTS / "memory_repr_quick.png")
        return res
    if args.quick:
        return run_quick(args)
    if args.plot_only:
        res = json.loads((RESULTS / "memory_repr.json").read_text())
        plot(res, RESULTS / "memory_repr.png")
        return res
    torch.set_num_threads(args.threads)
    WORK.mkdir(parents=True, exist_ok=True)
    enc = Encoder()
    res = {"subsets": SUBSETS, "short_input": SHORT, "ks": list(KS), "q_delta": Q_DELTA, "datasets": {}}
    for name, make, fields, labelled in (("obliqa", obliqa, Fields(id="ID", text="Passage"), False),
                                         ("banking77", banking77, Fields(), True)):
        t0 = time.perf_counter()
        kb, queries = make(WORK)
        print(f"{name}: building {len(MEMORY_KINDS)} bundles", flush=True)
        arms = build_all(enc, kb, name, fields, WORK)
        lat = latency(arms, args.repeats)
        dl = deltas(arms, [q.text for q in queries[:Q_DELTA]])
        ql = quality(arms, queries, labelled)
        kv_bytes = arms["kv"]["memory_bytes"]
        res["datasets"][name] = {"queries": len(queries), "chunks": arms["kv"]["chunks"], "tokens": arms["kv"]["tokens"],
                                 "seconds": round(time.perf_counter() - t0, 1), "arms": {
            kind: {k: v for k, v in a.items() if k not in ("path", "engine")}
            | {"ratio_vs_kv": round(kv_bytes / a["memory_bytes"], 3) if a["memory_bytes"] else None}
            | lat[kind] | dl[kind] | {"quality": ql[kind],
                                      "quality_delta_vs_kv": {m: round(ql[kind][m] - ql["kv"][m], 3) for m in ql[kind] if m != "eval_s"}}
            for kind, a in arms.items()}}
        print(json.dumps({k: {m: v[m] for m in ("memory_bytes_per_chunk", "ratio_vs_kv", "p50_ms_k8", "p50_ms_k32", "max_abs_delta")}
                          for k, v in res["datasets"][name]["arms"].items()}, indent=1), flush=True)
    res["targets"] = targets(res)
    written = write("memory_repr", res)
    out = result_path("memory_repr")
    plot(res, RESULTS / "memory_repr.png")
    print(f"wrote {out}")
    print(json.dumps(res["targets"], indent=1))
    return written


def targets(res: dict) -> dict:
    """The issue's targets, checked on both datasets; the best lossy = the fewest bytes with |Δ| ≤ 1e-3."""
    t = {}
    for name, d in res["datasets"].items():
        a = d["arms"]
        lossy = [k for k in ("hidden-fp16", "hidden-int8") if a[k]["max_abs_delta"] <= 1e-3]
        best = min(lossy, key=lambda k: a[k]["memory_bytes"]) if lossy else None
        t[name] = {"hidden_ratio": a["hidden"]["ratio_vs_kv"], "hidden_delta": a["hidden"]["max_abs_delta"],
                   "hidden_ok": a["hidden"]["ratio_vs_kv"] >= 2 and a["hidden"]["max_abs_delta"] <= 1e-5,
                   "best_lossy": best}
        if best:
            worst_quality = max(abs(v) for v in a[best]["quality_delta_vs_kv"].values())
            t[name] |= {"best_lossy_ratio": a[best]["ratio_vs_kv"], "best_lossy_delta": a[best]["max_abs_delta"],
                        "best_lossy_worst_quality_delta_points": worst_quality,
                        "best_lossy_ok": a[best]["ratio_vs_kv"] >= 8 and worst_quality <= 0.1}
    return t


if __name__ == "__main__":  # python -m bench memory_repr: the same as python -m bench memory_repr
    import sys

    from bench.__main__ import main

    main(["memory_repr", *sys.argv[1:]])
