"""Hybrid (dense + BM25) retrieval on ObliQA: choose its defaults on validation, report on test.

    python -m bench hybrid_obliqa [--bundle DIR] [--val FILE] [--test FILE] [--cache DIR]
                                 [--limit-val N] [--limit-test N] [--name hybrid_obliqa]

How it measures (the KB, the queries, what is timed and checked): docs/benchmarks.md, "Methods",
`hybrid_obliqa`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, result_path, write
from softknn.evaluation.metrics import ndcg_at_k, retrieval_metrics
from softknn.evaluation.run import ranked_ids, read_queries, sample
from softknn.index_builder.reader import Fields
from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import scores_reference

ROOT = Path(__file__).resolve().parents[1]

EVAL = ROOT / "artifacts" / "eval"
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
POOLS = (10, 20, 50, 100, 200)
K1S = (0.9, 1.2, 1.5)
BS = (0.4, 0.75)
K = 10
RRF_C = 60
# the BM25 parameters the sweep started from (bm25s/Lucene's usual k1, b; LexicalSpec's default
# when this was first run): another pair must beat them by --bm25-margin to be chosen
BASELINE_BM25 = LexicalSpec(k1=1.5, b=0.75)


# --- inputs -----------------------------------------------------------------------------------
def load_bundle_arrays(bundle: Path) -> tuple[np.ndarray, list[str], list[str], list[str], dict]:
    """(embeddings (N, D) float32, chunk ids, doc ids, chunk texts, manifest) in bundle row order."""
    emb = np.asarray(np.load(bundle / "embeddings.npy"), dtype=np.float32)
    chunk_ids, doc_ids, texts = [], [], []
    with open(bundle / "chunks.jsonl", encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            chunk_ids.append(str(c["chunk_id"]))
            doc_ids.append(str(c["doc_id"]))
            texts.append(c["text"])
    if len(texts) != len(emb):
        raise SystemExit(f"{bundle}: {len(emb)} embeddings but {len(texts)} chunks")
    manifest = json.loads((bundle / "manifest.json").read_text()) if (bundle / "manifest.json").exists() else {}
    return emb, chunk_ids, doc_ids, texts, manifest


_ENCODER: dict = {}  # one model load for both question sets


def embed_questions(queries, cache: Path, manifest: dict, batch_size: int = 64) -> tuple[np.ndarray, dict]:
    """e_q (n, D) float32 as the service computes it (tokenize, truncate, plain forward, pooled +
    normalised), cached by question ids + texts + model fingerprint."""
    from softknn.model.encoder import Encoder
    from softknn.params import Settings

    key = hashlib.sha256("\n".join(f"{q.id}\t{q.text}" for q in queries).encode()).hexdigest()[:16]
    path = cache / f"qemb_{key}.npz"
    model = (manifest.get("model") or {})
    if path.exists():
        z = np.load(path)
        if not model.get("fingerprint") or str(z["fingerprint"]) == model.get("fingerprint"):
            return z["emb"], {"cached": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), "s": 0.0}
    t0 = time.perf_counter()
    enc = _ENCODER.get("enc") or _ENCODER.setdefault("enc", Encoder(Settings().model.name, device="cpu"))
    if model.get("fingerprint") and model["fingerprint"] != enc.info.fingerprint:
        raise SystemExit(f"encoder {enc.info.fingerprint} is not the bundle's model {model['fingerprint']}")
    out = np.zeros((len(queries), enc.info.dim), dtype=np.float32)
    order = sorted(range(len(queries)), key=lambda i: (len(queries[i].text), i))
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        batch = enc.tokenize([queries[i].text for i in rows], truncate=True)
        out[rows] = enc.forward_plain(batch).embedding.float().cpu().numpy()
    dt = time.perf_counter() - t0
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, emb=out, ids=np.array([q.id for q in queries]), fingerprint=np.array(enc.info.fingerprint))
    return out, {"cached": None, "s": dt}


# --- ranking ----------------------------------------------------------------------------------
def top_rows(s: np.ndarray, ids: np.ndarray | None = None, k: int = K) -> np.ndarray:
    """The k best rows by (score desc, id asc), = softknn.retrieval.scoring.best, without sorting all N."""
    if ids is None:
        ids = np.arange(len(s))
    k = min(k, len(s))
    if k <= 0:
        return ids[:0]
    t = np.partition(s, len(s) - k)[len(s) - k]  # k-th largest
    sel = np.flatnonzero(s >= t)
    order = np.lexsort((ids[sel], -s[sel]))[:k]
    return ids[sel[order]]


def ordered(x: np.ndarray, m: int, positive: bool = False) -> np.ndarray:
    """Ids of x's top m (score desc, id asc); only x > 0 when `positive` (a BM25 result list)."""
    r = top_rows(x, k=m)
    return r[x[r] > 0] if positive else r


def rule_union_minmax(d, b, dl, bl, weight):
    """(a) min-max of d and b over the union of the two top-m lists, then (1 − λ)·d̂ + λ·b̂."""
    cand = np.union1d(dl, bl)

    def mm(x):
        lo, hi = x.min(), x.max()
        return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)

    s = (1 - weight) * mm(d[cand].astype(np.float64)) + weight * mm(b[cand].astype(np.float64))
    return top_rows(s, cand)


def rule_rrf(dl, bl, weight, c=RRF_C):
    """(b) weighted RRF over the two top-m lists: (1 − λ)/(c + r_d) + λ/(c + r_b), rank r from 1."""
    cand = np.union1d(dl, bl)
    s = np.zeros(len(cand))
    s[np.searchsorted(cand, dl)] += (1 - weight) / (c + 1 + np.arange(len(dl)))
    s[np.searchsorted(cand, bl)] += weight / (c + 1 + np.arange(len(bl)))
    return top_rows(s, cand)


class Scorer:
    """Per question set: dense sims D (n, N), BM25 scores per LexicalSpec, gold sets, and metrics."""

    def __init__(self, queries, qemb, emb, doc_ids):
        self.queries = queries
        self.gold = [q.gold for q in queries]
        self.doc_ids = np.asarray(doc_ids, dtype=object)
        self.D = qemb @ emb.T  # (n, N) float32, = the flat index's inner product
        self.B: dict[LexicalSpec, np.ndarray] = {}

    def add_bm25(self, spec: LexicalSpec, lex: LexicalIndex) -> float:
        t0 = time.perf_counter()
        self.B[spec] = np.stack([lex.scores(lex.analyzer.terms(q.text)) for q in self.queries])
        return time.perf_counter() - t0

    def ranked(self, rows: np.ndarray) -> list[str]:
        return ranked_ids([("", d) for d in self.doc_ids[rows]], "doc")

    def evaluate(self, rank_fn) -> tuple[dict, list[list[str]]]:
        """rank_fn(i) → top-K chunk rows of question i; metrics over unique doc ids."""
        ranked = [self.ranked(rank_fn(i)) for i in range(len(self.queries))]
        return retrieval_metrics(ranked, self.gold), ranked

    def reference(self, spec: LexicalSpec | None, mode: str, weight: float, pool: int):
        B = self.B[spec] if spec is not None else None
        return self.evaluate(lambda i: top_rows(scores_reference(self.D[i], None if B is None else B[i], mode,
                                                                 weight, pool)))

    def lists(self, spec: LexicalSpec, m: int):
        B = self.B[spec]
        return ([ordered(self.D[i], m) for i in range(len(self.queries))],
                [ordered(B[i], m, positive=True) for i in range(len(self.queries))])

    def comparison(self, spec: LexicalSpec, rule: str, weight: float, m: int, lists=None):
        dl, bl = lists or self.lists(spec, m)
        B = self.B[spec]
        if rule == "union_minmax":
            return self.evaluate(lambda i: rule_union_minmax(self.D[i], B[i], dl[i], bl[i], weight))
        return self.evaluate(lambda i: rule_rrf(dl[i], bl[i], weight))


def module_defaults() -> dict:
    """λ, m (softknn.retrieval.scoring.LEXICAL_WEIGHT, CANDIDATES, when defined) and LexicalSpec's k1, b."""
    import softknn.retrieval.scoring as r

    spec = LexicalSpec()
    return {"weight": getattr(r, "LEXICAL_WEIGHT", None), "pool": getattr(r, "CANDIDATES", None),
            "k1": spec.k1, "b": spec.b}


def spec_name(spec: LexicalSpec) -> str:
    return f"k1={spec.k1},b={spec.b}"


def per_query_ndcg(ranked, gold) -> np.ndarray:
    return np.array([ndcg_at_k(r, set(g), K) for r, g in zip(ranked, gold, strict=True) if g])


def paired_bootstrap(a: np.ndarray, b: np.ndarray, reps: int = 2000, seed: int = 0) -> dict:
    """mean(a − b) and its 95 % percentile interval over resampled questions."""
    diff = a - b
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(reps, len(diff)))].mean(1)
    return {"mean": float(diff.mean()), "ci95": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]}


# --- plot -------------------------------------------------------------------------------------
def plot(path: Path, cells: list[dict], spec: str, dense: float, lexical: float, chosen: dict, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for m in POOLS:
        pts = sorted((c["weight"], c["val"]["ndcg@10"]) for c in cells
                     if c["rule"] == "reference" and c["mode"] == "hybrid" and c["pool"] == m and c["bm25"] == spec)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"hybrid, m={m}")
    ax.axhline(dense, color="k", ls="--", lw=1, label=f"dense {dense:.3f}")
    ax.axhline(lexical, color="gray", ls=":", lw=1.5, label=f"lexical (BM25) {lexical:.3f}")
    ax.scatter([chosen["weight"]], [chosen["val"]["ndcg@10"]], s=160, facecolors="none", edgecolors="r", zorder=5,
               label=f"chosen λ={chosen['weight']}, m={chosen['pool']}")
    ax.set_xlabel("λ (BM25 weight)")
    ax.set_ylabel("nDCG@10")
    ax.set_title(f"ObliQA validation ({n} questions), BM25 {spec}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main -------------------------------------------------------------------------------------
def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bundle", type=Path, default=EVAL / "bundles" / "obliqa")
    ap.add_argument("--val", type=Path, default=EVAL / "obliqa" / "questions_val.jsonl")
    ap.add_argument("--test", type=Path, default=EVAL / "obliqa" / "questions_test.jsonl")
    ap.add_argument("--cache", type=Path, default=EVAL / "hybrid_obliqa", help="question embeddings, ranked lists")
    ap.add_argument("--limit-val", type=int, default=None, help="a seeded subset of the validation questions")
    ap.add_argument("--limit-test", type=int, default=None, help="a seeded subset of the test questions")
    ap.add_argument("--bm25-margin", type=float, default=0.005,
                    help="nDCG@10 a non-default (k1, b) must win by to replace the default")
    ap.add_argument("--build-seconds", type=float, default=None, help="wall time of the bundle build, for the record")
    ap.add_argument("--name", default="hybrid_obliqa", help="bench/results/<name>.json and .png")


def run(args: argparse.Namespace) -> dict:
    command = args.command
    timings: dict = {}
    t_all = time.perf_counter()

    t0 = time.perf_counter()
    emb, chunk_ids, doc_ids, texts, manifest = load_bundle_arrays(args.bundle)
    timings["load_bundle_s"] = time.perf_counter() - t0
    fields = Fields(id="id", text="text", label=None)
    val = sample(read_queries(args.val, fields), args.limit_val)
    test = sample(read_queries(args.test, fields), args.limit_test)
    print(f"bundle {args.bundle}: {len(emb)} chunks of {len(set(doc_ids))} passages; {len(val)} val, {len(test)} test",
          flush=True)

    qv, tv = embed_questions(val, args.cache, manifest)
    qt, tt = embed_questions(test, args.cache, manifest)
    timings["embed_val"], timings["embed_test"] = tv, tt

    default = BASELINE_BM25
    specs = [LexicalSpec(k1=k1, b=b) for k1 in K1S for b in BS]
    if default not in specs:
        specs.append(default)
    lex: dict[LexicalSpec, LexicalIndex] = {}
    timings["bm25_build_s"] = {}
    for spec in specs:
        t0 = time.perf_counter()
        lex[spec] = LexicalIndex.build(texts, spec)
        timings["bm25_build_s"][spec_name(spec)] = time.perf_counter() - t0
    print(f"BM25 indexes built ({len(specs)} specs)", flush=True)

    V = Scorer(val, qv, emb, doc_ids)
    timings["bm25_score_val_s"] = {spec_name(s): V.add_bm25(s, lex[s]) for s in specs}

    # --- validation sweep -----------------------------------------------------------------------
    cells: list[dict] = []
    t0 = time.perf_counter()
    met, _ = V.reference(None, "dense", 0.0, 1)
    dense_val = met
    cells.append({"rule": "reference", "mode": "dense", "bm25": None, "weight": None, "pool": None, "val": met})
    for spec in specs:
        for m in POOLS:
            met, _ = V.reference(spec, "lexical", 1.0, m)
            cells.append({"rule": "reference", "mode": "lexical", "bm25": spec_name(spec), "weight": None, "pool": m,
                          "val": met})
            for w in WEIGHTS:
                met, _ = V.reference(spec, "hybrid", w, m)
                cells.append({"rule": "reference", "mode": "hybrid", "bm25": spec_name(spec), "weight": w, "pool": m,
                              "val": met})
        print(f"  swept {spec_name(spec)} ({time.perf_counter() - t0:.0f}s)", flush=True)
    timings["sweep_reference_s"] = time.perf_counter() - t0

    def best_of(pred):
        return max((c for c in cells if pred(c)),
                   key=lambda c: (round(c["val"]["ndcg@10"], 12), c["val"]["recall@10"]))

    hyb = lambda c, s: c["rule"] == "reference" and c["mode"] == "hybrid" and c["bm25"] == s  # noqa: E731
    best_default = best_of(lambda c: hyb(c, spec_name(default)))
    best_any = best_of(lambda c: c["rule"] == "reference" and c["mode"] == "hybrid")
    gain = best_any["val"]["ndcg@10"] - best_default["val"]["ndcg@10"]
    chosen = best_any if gain > args.bm25_margin else best_default
    chosen_spec = next(s for s in specs if spec_name(s) == chosen["bm25"])
    why = (f"best validation nDCG@10 over λ × m × (k1, b); best with the baseline BM25 {spec_name(default)}: "
           f"{best_default['val']['ndcg@10']:.4f} (λ={best_default['weight']}, m={best_default['pool']}); best over all "
           f"BM25 params: {best_any['val']['ndcg@10']:.4f} ({best_any['bm25']}, λ={best_any['weight']}, "
           f"m={best_any['pool']}), gain {gain:+.4f} vs margin {args.bm25_margin}")
    print("chosen:", chosen["bm25"], chosen["weight"], chosen["pool"], chosen["val"], "\n ", why, flush=True)

    # is the BM25 change more than noise? paired over the validation questions
    default_spec = default
    any_spec = next(s for s in specs if spec_name(s) == best_any["bm25"])
    _, r_any = V.reference(any_spec, "hybrid", best_any["weight"], best_any["pool"])
    _, r_def = V.reference(default_spec, "hybrid", best_default["weight"], best_default["pool"])
    bm25_gain_val = paired_bootstrap(per_query_ndcg(r_any, V.gold), per_query_ndcg(r_def, V.gold))

    # comparison rules (a), (b) with the chosen BM25 params
    t0 = time.perf_counter()
    for m in POOLS:
        L = V.lists(chosen_spec, m)
        for w in WEIGHTS:
            for rule in ("union_minmax", "rrf"):
                met, _ = V.comparison(chosen_spec, rule, w, m, L)
                cells.append({"rule": rule, "mode": "hybrid", "bm25": chosen["bm25"], "weight": w, "pool": m,
                              "val": met})
    timings["sweep_comparison_s"] = time.perf_counter() - t0
    best_union = best_of(lambda c: c["rule"] == "union_minmax")
    best_rrf = best_of(lambda c: c["rule"] == "rrf")
    plain_rrf = best_of(lambda c: c["rule"] == "rrf" and c["weight"] == 0.5)
    lexical_val = next(c for c in cells if c["rule"] == "reference" and c["mode"] == "lexical"
                       and c["bm25"] == chosen["bm25"] and c["pool"] == chosen["pool"])

    # --- test -------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    T = Scorer(test, qt, emb, doc_ids)
    timings["bm25_score_test_s"] = T.add_bm25(chosen_spec, lex[chosen_spec])
    if default_spec != chosen_spec:
        T.add_bm25(default_spec, lex[default_spec])
    runs = {
        "dense": T.reference(None, "dense", 0.0, 1),
        "lexical": T.reference(chosen_spec, "lexical", 1.0, chosen["pool"]),
        "hybrid": T.reference(chosen_spec, "hybrid", chosen["weight"], chosen["pool"]),
        "union_minmax": T.comparison(chosen_spec, "union_minmax", best_union["weight"], best_union["pool"]),
        "rrf": T.comparison(chosen_spec, "rrf", best_rrf["weight"], best_rrf["pool"]),
        "rrf_plain": T.comparison(chosen_spec, "rrf", 0.5, plain_rrf["pool"]),
    }
    if default_spec != chosen_spec:  # for the record: what the baseline BM25 parameters would have given
        runs["lexical_default_bm25"] = T.reference(default_spec, "lexical", 1.0, best_default["pool"])
        runs["hybrid_default_bm25"] = T.reference(default_spec, "hybrid", best_default["weight"], best_default["pool"])
    # the defaults softknn.retrieval.scoring / LexicalSpec carry now (set from this sweep), if they differ
    mod = module_defaults()
    mod_spec = LexicalSpec(k1=mod["k1"], b=mod["b"])
    if mod["weight"] is not None and (mod["weight"], mod["pool"], mod_spec) != (chosen["weight"], chosen["pool"], chosen_spec):
        if mod_spec not in T.B:
            T.add_bm25(mod_spec, lex.get(mod_spec) or LexicalIndex.build(texts, mod_spec))
        runs["hybrid_module_defaults"] = T.reference(mod_spec, "hybrid", mod["weight"], mod["pool"])
    timings["test_s"] = time.perf_counter() - t0
    settings = {"dense": {}, "lexical": {"pool": chosen["pool"]},
                "hybrid": {"weight": chosen["weight"], "pool": chosen["pool"]},
                "union_minmax": {"weight": best_union["weight"], "pool": best_union["pool"]},
                "rrf": {"weight": best_rrf["weight"], "pool": best_rrf["pool"], "c": RRF_C},
                "rrf_plain": {"weight": 0.5, "pool": plain_rrf["pool"], "c": RRF_C},
                "lexical_default_bm25": {"pool": best_default["pool"], "bm25": spec_name(default_spec)},
                "hybrid_default_bm25": {"weight": best_default["weight"], "pool": best_default["pool"],
                                        "bm25": spec_name(default_spec)},
                "hybrid_module_defaults": {"weight": mod["weight"], "pool": mod["pool"],
                                           "bm25": spec_name(mod_spec)}}
    nd = {k: per_query_ndcg(r, T.gold) for k, (_, r) in runs.items()}
    by_group = {}  # ObliQA's question `group` (read_queries keeps no metadata: read it from the file)
    with open(args.test, encoding="utf-8") as f:
        gid = {str(r["id"]): r.get("group") for r in map(json.loads, f)}
    for g in sorted({gid[q.id] for q in test}, key=str):
        rows = [i for i, q in enumerate(test) if gid[q.id] == g]
        by_group[str(g)] = {k: retrieval_metrics([r[i] for i in rows], [T.gold[i] for i in rows])
                            for k, (_, r) in runs.items() if k in ("dense", "lexical", "hybrid")}
    test_out = {
        "n": len(test),
        "bm25": chosen["bm25"],
        "runs": {k: {"settings": settings[k], **met} for k, (met, _) in runs.items()},
        "hybrid_minus_dense_ndcg@10": paired_bootstrap(nd["hybrid"], nd["dense"]),
        "hybrid_minus_lexical_ndcg@10": paired_bootstrap(nd["hybrid"], nd["lexical"]),
        "by_group": by_group,
    }
    h, d, lx = (test_out["runs"][k] for k in ("hybrid", "dense", "lexical"))
    test_out["targets"] = {
        "ndcg@10>=0.69": h["ndcg@10"] >= 0.69,
        "recall@10>=0.78": h["recall@10"] >= 0.78,
        "beats_dense_by_0.02": h["ndcg@10"] - d["ndcg@10"] >= 0.02,
        "beats_lexical_by_0.02": h["ndcg@10"] - lx["ndcg@10"] >= 0.02,
    }
    args.cache.mkdir(parents=True, exist_ok=True)
    with open(args.cache / "test_ranked.jsonl", "w", encoding="utf-8") as f:
        for i, q in enumerate(test):
            f.write(json.dumps({"id": q.id, "gold": q.gold, **{k: r[i] for k, (_, r) in runs.items()}}) + "\n")
    timings["total_s"] = time.perf_counter() - t_all
    if args.build_seconds is not None:
        timings["bundle_build_s"] = args.build_seconds

    payload = {
        "command": command,
        "bundle": {"path": str(args.bundle), "chunks": len(emb), "passages": len(set(doc_ids)),
                   "version_id": manifest.get("version_id"), "model": (manifest.get("model") or {}).get("name"),
                   "index": (manifest.get("index") or {}).get("kind")},
        "definitions": {
            "reference": "softknn.retrieval.scoring.scores_reference: s = (1−λ)·norm_m(d) + λ·norm_m(b), norm_m min-max "
                         "clipped to [0,1] against each retriever's m-th best over the whole KB",
            "union_minmax": "(a) d and b min-max normalised over (dense top m) ∪ (BM25 top m, b > 0), then "
                            "(1−λ)·d̂ + λ·b̂ over those candidates",
            "rrf": f"(b) (1−λ)/({RRF_C} + r_dense) + λ/({RRF_C} + r_bm25) over the two top-m lists (BM25 list: "
                   "b > 0), rank from 1; λ = 0.5 is plain RRF",
            "ranking": f"top {K} chunks by s (score desc, chunk row asc), then doc ids deduplicated (first kept), "
                       "softknn.evaluation.metrics.retrieval_metrics against gold_ids",
        },
        "grid": {"weights": WEIGHTS, "pools": POOLS, "k1": K1S, "b": BS, "baseline_bm25": spec_name(default)},
        "module_defaults_at_run": module_defaults(),
        "validation": {
            "n": len(val),
            "dense": dense_val,
            "lexical_at_chosen": lexical_val["val"],
            "best_hybrid_default_bm25": best_default,
            "best_hybrid_any_bm25": best_any,
            "bm25_change_gain_ndcg@10": bm25_gain_val,
            "best_union_minmax": best_union,
            "best_rrf": best_rrf,
            "plain_rrf": plain_rrf,
            "cells": cells,
        },
        "chosen": {"weight": chosen["weight"], "pool": chosen["pool"], "k1": chosen_spec.k1, "b": chosen_spec.b,
                   "val": chosen["val"], "why": why},
        "test": test_out,
        "timings": timings,
    }
    written = write(args.name, payload)
    out = result_path(args.name)
    png = RESULTS / f"{args.name}.png"
    plot(png, cells, chosen["bm25"], dense_val["ndcg@10"], lexical_val["val"]["ndcg@10"], chosen, len(val))
    print(f"wrote {out} and {png}")
    for k, r in test_out["runs"].items():
        print(f"  test {k:13s} nDCG@10 {r['ndcg@10']:.4f}  R@10 {r['recall@10']:.4f}  MRR@10 {r['mrr@10']:.4f}  "
              f"R@1 {r['recall@1']:.4f}  R@5 {r['recall@5']:.4f}  {r['settings']}")
    print("  targets:", test_out["targets"])
    return written


if __name__ == "__main__":  # python -m bench hybrid_obliqa: the same as python -m bench hybrid_obliqa
    import sys

    from bench.__main__ import main

    main(["hybrid_obliqa", *sys.argv[1:]])
