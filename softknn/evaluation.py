"""Quality of a bundle on a query set, beside the plain sentence-embedding k-NN baseline (issue 4).

One pass per batch of queries feeds both systems: the plain forward gives e_q, whose FAISS top-K
is the baseline (1-NN, weighted k-NN labels; ranking by similarity s = e_q·e_c) and the engine's
retrieval R; the fused pass gives softknn's labels (Nadaraya–Watson over w_db, or over the
second-round w_db when the fused embedding is used to retrieve again) and evidence order.

Metrics, binary relevance, gold set G, ranked unique ids r_1, r_2, …:
    recall@k = |G ∩ {r_1..r_k}| / |G|
    nDCG@k   = Σ_{i≤k, r_i∈G} 1/log2(i+1) / Σ_{i≤min(k,|G|)} 1/log2(i+1)
    MRR@k    = 1 / min{i ≤ k : r_i ∈ G}, 0 when no gold id is in the top k
    accuracy = mean(pred = gold), an abstention or no prediction counting as wrong
    macro-F1 = mean over labels (gold ∪ predicted) of 2·tp / (2·tp + fp + fn)
Abstain (the engine's rule: reject when the top label score < t), over in-scope queries:
    rejection(t) = P(score < t);  answered accuracy(t) = P(correct | score ≥ t)
    loss(t) = P(correct) − P(correct ∧ score ≥ t)   (the right answers given up)
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from index_builder.reader import Fields, read_kb
from softknn.attention import knn_weights
from softknn.bundle import MANIFEST, atomic_write_bytes, verify_bundle, version_id
from softknn.engine import Engine, InferParams
from softknn.errors import InvalidInput, KBFormatError

MATCH = ("doc", "chunk")
REQUERY = ("fused", "sum")


# --- query sets -------------------------------------------------------------------------------
@dataclass
class Query:
    id: str
    text: str
    label: str | None = None
    gold: list[str] = field(default_factory=list)  # gold chunk or doc ids


def _gold_ids(value, where: str) -> list[str]:
    """A list of ids, one id, or (CSV) a JSON list written in a cell."""
    if value is None or value == "":
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise KBFormatError(f"{where}: gold field is not a JSON list: {e.msg}") from e
    if isinstance(value, (str, int)):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return [str(v) for v in value]
    raise KBFormatError(f"{where}: gold ids must be an id or a list of ids, got {type(value).__name__}")


def read_queries(path: Path, fields: Fields = Fields(), gold_field: str | None = "gold_ids") -> list[Query]:
    """Queries from any format the builder reads; gold ids from `gold_field` (a list or one id)."""
    docs = read_kb(Path(path), fields)
    return [Query(d.doc_id, d.text, d.label, _gold_ids(d.metadata.get(gold_field), d.source) if gold_field else [])
            for d in docs]


def sample(queries: list[Query], limit: int | None, seed: int = 0) -> list[Query]:
    """A seeded random subset of `limit` queries, in their original order (all when limit is None)."""
    if limit is None or limit >= len(queries):
        return queries
    keep = sorted(random.Random(seed).sample(range(len(queries)), limit))
    return [queries[i] for i in keep]


# --- metrics ----------------------------------------------------------------------------------
def recall_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    return len(gold.intersection(ranked[:k])) / len(gold)


def ndcg_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, r in enumerate(ranked[:k]) if r in gold)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(gold))))
    return dcg / ideal


def mrr_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    return next((1.0 / (i + 1) for i, r in enumerate(ranked[:k]) if r in gold), 0.0)


def retrieval_metrics(ranked: list[Sequence[str]], gold: list[Sequence[str]], ks: Sequence[int] = (1, 5, 10),
                      depth: int = 10) -> dict:
    """Means over queries with a non-empty gold set; `ranked` lists are unique ids, best first."""
    pairs = [(r, set(g)) for r, g in zip(ranked, gold, strict=True) if g]
    if not pairs:
        return {"n": 0}
    out: dict = {"n": len(pairs)}
    for k in ks:
        out[f"recall@{k}"] = float(np.mean([recall_at_k(r, g, k) for r, g in pairs]))
    out[f"ndcg@{depth}"] = float(np.mean([ndcg_at_k(r, g, depth) for r, g in pairs]))
    out[f"mrr@{depth}"] = float(np.mean([mrr_at_k(r, g, depth) for r, g in pairs]))
    return out


def classification_metrics(gold: Sequence[str], pred: Sequence[str | None]) -> dict:
    """Accuracy and macro-F1 over labels in gold ∪ predictions; None predictions are wrong."""
    if not gold:
        return {"n": 0}
    labels = sorted(set(gold) | {p for p in pred if p is not None})
    tp = dict.fromkeys(labels, 0)
    fp = dict.fromkeys(labels, 0)
    fn = dict.fromkeys(labels, 0)
    for g, p in zip(gold, pred, strict=True):
        if p == g:
            tp[g] += 1
            continue
        fn[g] += 1
        if p is not None:
            fp[p] += 1
    f1 = [2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) if tp[c] + fp[c] + fn[c] else 0.0 for c in labels]
    return {"n": len(gold), "accuracy": sum(tp.values()) / len(gold), "macro_f1": float(np.mean(f1))}


def abstain_point(scores: Sequence[float], correct: Sequence[bool], t: float) -> dict:
    s, c = np.asarray(scores, dtype=np.float64), np.asarray(correct, dtype=bool)
    keep = s >= t
    return {
        "threshold": float(t),
        "rejection_rate": float(1 - keep.mean()),
        "answered_accuracy": float(c[keep].mean()) if keep.any() else None,
        "accuracy_loss": float(c.mean() - (c & keep).mean()),
    }


def abstain_curve(scores: Sequence[float], correct: Sequence[bool], points: int = 101) -> list[dict]:
    """The trade-off at thresholds spread over the score quantiles (rejection 0 → 1)."""
    s = np.asarray(scores, dtype=np.float64)
    if not len(s):
        return []
    ts = np.unique(np.concatenate([[0.0], np.quantile(s, np.linspace(0, 1, points)), [np.inf]]))
    return [abstain_point(scores, correct, t) for t in ts]


def choose_threshold(scores: Sequence[float], correct: Sequence[bool], target_loss: float) -> float:
    """The largest t (0 or an observed score) with loss(t) ≤ target_loss: most rejection for that cost."""
    s = np.asarray(scores, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    best = 0.0
    for t in np.unique(s):  # loss(t) is non-decreasing in t
        if c.mean() - (c & (s >= t)).mean() <= target_loss + 1e-12:
            best = float(t)
        else:
            break
    return best


def rejection_rate(scores: Sequence[float], t: float | None) -> float | None:
    return None if t is None or not len(scores) else float(np.mean(np.asarray(scores) < t))


# --- running: one plain pass, the baseline and any number of softknn variants -----------------
@dataclass(frozen=True)
class Strategy:
    """How softknn's label and evidence order are read out.

    rounds=1: the engine as served (w_db from e_q; evidence by memory-mass share).
    rounds=2: retrieve again with the fused embedding e' (requery="fused") or with
    normalise(e_q + e') ("sum"), fuse again; labels and evidence come from the second round.
    """

    rounds: int = 1
    requery: str = "fused"

    def validate(self) -> Strategy:
        if self.rounds not in (1, 2) or self.requery not in REQUERY:
            raise InvalidInput(f"strategy: rounds must be 1 or 2 and requery one of {REQUERY}, got {self}")
        return self


@dataclass
class Run:
    """Per query: the plain top-K (D, I) over chunk rows, and each variant's outcome dicts."""

    queries: list[Query]
    D: np.ndarray  # (n, K) similarities e_q·e_c, best first
    I: np.ndarray  # (n, K) chunk rows
    variants: list[tuple[InferParams, Strategy]]
    outcomes: list[list[dict]]  # [variant][query]


def _ranked_ids(items: list[tuple[str, str]], match: str) -> list[str]:
    """Unique ids in order from (chunk_id, doc_id) pairs, by `match` (first occurrence kept)."""
    seen: dict[str, None] = {}
    for chunk_id, doc_id in items:
        seen.setdefault(doc_id if match == "doc" else chunk_id, None)
    return list(seen)


def _outcome(r: dict, match: str) -> dict:
    scores = r["label_scores"] or {}
    top = next(iter(scores.items()), (None, 0.0))
    ev = r["evidence"]
    return {
        "prediction": top[0],  # forced: the abstain rule is applied afterwards with its threshold
        "score": float(top[1]),
        "max_similarity": max((e["similarity"] for e in ev), default=0.0),
        "ranked": _ranked_ids([(e["chunk_id"], e["doc_id"]) for e in ev], match),
        "label_scores": dict(list(scores.items())[:3]),
        "memory_share": r["diagnostics"]["memory_share"],
        "w_db_effective_k": r["diagnostics"]["w_db_effective_k"],
    }


def _fused(engine: Engine, batch, plain, xq: np.ndarray, params: InferParams, strategy: Strategy) -> list[dict]:
    """Engine.infer's retrieve + fuse on a shared plain pass (tests check it equals infer); round 2 optional."""
    ps = [params] * len(xq)
    res = engine.fuse(batch, plain, engine.retrieve(xq, ps), ps)
    if strategy.rounds == 2:
        e1 = np.asarray([r["embedding"] for r in res], dtype=np.float32)  # (B, D) fused embeddings
        xq2 = e1 if strategy.requery == "fused" else xq + e1
        xq2 = xq2 / np.linalg.norm(xq2, axis=1, keepdims=True)
        res = engine.fuse(batch, plain, engine.retrieve(xq2, ps), ps)
    return res


def run_variants(engine: Engine, queries: list[Query], variants: list[tuple[InferParams, Strategy]], *,
                 depth: int = 64, batch_size: int = 32, match: str = "doc", progress: bool = True,
                 desc: str = "eval") -> Run:
    """Run every variant over `queries` (batched, shortest first to pad less) sharing one plain pass."""
    if match not in MATCH:
        raise InvalidInput(f"match must be one of {MATCH}, got {match!r}", field="match")
    if not queries:
        raise InvalidInput("no queries to evaluate", field="queries")
    variants = [(replace(p, truncate=True, evidence=max(p.k, p.evidence), abstain_threshold=0.0).validate(), s.validate())
                for p, s in variants]
    enc = engine.encoder
    n, K = len(queries), min(max([depth] + [p.k for p, _ in variants]), len(engine.bundle))
    D = np.zeros((n, K), dtype=np.float32)
    I = np.full((n, K), -1, dtype=np.int64)
    outcomes: list[list[dict]] = [[{}] * n for _ in variants]
    order = sorted(range(n), key=lambda i: (len(queries[i].text), i))
    bar = tqdm(total=n * len(variants), desc=desc, unit="query", disable=not progress)
    for start in range(0, n, batch_size):
        rows = order[start : start + batch_size]
        batch = enc.tokenize([queries[i].text for i in rows], truncate=True)
        plain = enc.forward_plain(batch, keep_hidden=True)
        xq = plain.embedding.float().cpu().numpy()  # (B, D)
        D[rows], I[rows] = engine.bundle.index.search(xq, K, exact=any(p.exact for p, _ in variants))
        for v, (params, strategy) in enumerate(variants):
            for i, r in zip(rows, _fused(engine, batch, plain, xq, params, strategy), strict=True):
                outcomes[v][i] = _outcome(r, match)
            bar.update(len(rows))
    bar.close()
    return Run(queries, D, I, variants, outcomes)


def baseline_outcomes(run: Run, chunks: list[dict], k: int, temperature: float, kernel: str = "softmax",
                      match: str = "doc") -> list[dict]:
    """Plain k-NN from the stored top-K: 1-NN label, weighted k-NN label (w = kernel(s/τ) over the top
    k), its top score, and the ranking of the top k chunks by similarity."""
    k = min(k, run.I.shape[1])
    D, I = run.D[:, :k], run.I[:, :k]
    w = knn_weights(torch.from_numpy(D), torch.from_numpy(I >= 0), temperature, kernel).numpy()  # (n, k)
    out = []
    for d, ids, ws in zip(D, I, w, strict=True):
        acc: dict[str, float] = {}
        for r, x in zip(ids.tolist(), ws.tolist(), strict=True):
            lab = chunks[r].get("label") if r >= 0 else None
            if lab is not None and x > 0:
                acc[lab] = acc.get(lab, 0.0) + x
        top = min(acc.items(), key=lambda kv: (-kv[1], kv[0]), default=(None, 0.0))
        out.append({
            "nn1": chunks[ids[0]].get("label") if ids[0] >= 0 else None,
            "prediction": top[0],
            "score": float(top[1]),
            "max_similarity": float(d[0]),
            "ranked": _ranked_ids([(chunks[r]["chunk_id"], chunks[r]["doc_id"]) for r in ids.tolist() if r >= 0], match),
        })
    return out


# --- the report -------------------------------------------------------------------------------
def auroc(pos: Sequence[float], neg: Sequence[float]) -> float | None:
    """P(score_pos > score_neg) + ½·P(tie): how well a score separates in-scope (pos) from OOD (neg)."""
    if not len(pos) or not len(neg):
        return None
    p, n = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    ranks = np.argsort(np.argsort(np.concatenate([p, n]), kind="stable"), kind="stable").astype(np.float64)
    allv = np.concatenate([p, n])  # average ranks over ties
    for v in np.unique(allv):
        tie = allv == v
        ranks[tie] = ranks[tie].mean()
    return float((ranks[: len(p)].sum() - len(p) * (len(p) - 1) / 2) / (len(p) * len(n)))


def _abstain(scores, correct, threshold, ood_scores) -> dict:
    out = abstain_point(scores, correct, threshold) if threshold is not None else {"threshold": None}
    if ood_scores is not None:
        out["ood_rejection_rate"] = rejection_rate(ood_scores, threshold)
        out["ood_auroc"] = auroc(scores, ood_scores)
    return out


def _curve(scores, correct, ood_scores) -> list[dict]:
    pts = abstain_curve(scores, correct)
    if ood_scores is not None:
        for p in pts:
            p["ood_rejection_rate"] = rejection_rate(ood_scores, p["threshold"])
    return pts


def build_report(queries: list[Query], soft: list[dict], base_cls: list[dict], base_ret: list[dict], *,
                 threshold: float | None = None, baseline_threshold: float | None = None,
                 ood_soft: list[dict] | None = None, ood_base: list[dict] | None = None,
                 ks: Sequence[int] = (1, 5, 10), depth: int = 10) -> dict:
    """Classification (labelled queries) and evidence (queries with gold ids), softknn beside baseline.

    soft / base_cls / base_ret / ood_*: outcome dicts per query (see run_variants, baseline_outcomes).
    """
    rep: dict = {"n_queries": len(queries)}
    lab = [i for i, q in enumerate(queries) if q.label is not None]
    if lab:
        gold = [queries[i].label for i in lab]
        s_scores = [soft[i]["score"] for i in lab]
        s_ok = [soft[i]["prediction"] == queries[i].label for i in lab]
        b_scores = [base_cls[i]["score"] for i in lab]
        b_ok = [base_cls[i]["prediction"] == queries[i].label for i in lab]
        o_soft = [o["score"] for o in ood_soft] if ood_soft is not None else None
        o_base = [o["score"] for o in ood_base] if ood_base is not None else None
        rep["classification"] = {
            "n": len(lab),
            "softknn": classification_metrics(gold, [soft[i]["prediction"] for i in lab]),
            "baseline_1nn": classification_metrics(gold, [base_cls[i]["nn1"] for i in lab]),
            "baseline_knn": classification_metrics(gold, [base_cls[i]["prediction"] for i in lab]),
            "abstain": {
                "rule": "abstain when the top label score < threshold",
                "n_ood": len(ood_soft) if ood_soft is not None else 0,
                "softknn": _abstain(s_scores, s_ok, threshold, o_soft),
                "baseline_knn": _abstain(b_scores, b_ok, baseline_threshold, o_base),
            },
            "curves": {"softknn": _curve(s_scores, s_ok, o_soft), "baseline_knn": _curve(b_scores, b_ok, o_base)},
        }
        if ood_soft is not None:  # the similarity of the nearest chunk as an alternative OOD signal
            rep["classification"]["abstain"]["max_similarity_ood_auroc"] = auroc(
                [base_cls[i]["max_similarity"] for i in lab], [o["max_similarity"] for o in ood_base])
    gold_ids = [q.gold for q in queries]
    if any(gold_ids):
        rep["evidence"] = {
            "softknn": retrieval_metrics([o["ranked"] for o in soft], gold_ids, ks, depth),
            "baseline": retrieval_metrics([o["ranked"] for o in base_ret], gold_ids, ks, depth),
        }
    return rep


def summary(rep: dict) -> dict:
    """The report without its curves (what the docs cite)."""
    out = json.loads(json.dumps(rep))
    out.get("classification", {}).pop("curves", None)
    return out


def evaluate(engine: Engine, queries: list[Query], params: InferParams, strategy: Strategy = Strategy(), *,
             ood: list[Query] | None = None, baseline_k: int | None = None, baseline_temperature: float | None = None,
             threshold: float | None = None, baseline_threshold: float | None = None, ks: Sequence[int] = (1, 5, 10),
             depth: int = 10, match: str = "doc", batch_size: int = 32, progress: bool = True) -> tuple[dict, Run, Run | None]:
    """Run softknn (params, strategy) and the plain baseline over queries (and OOD queries); build the report.

    threshold None: the bundle's calibrated abstain threshold (may itself be None).
    """
    cal = engine.bundle.manifest.get("calibration") or {}
    if threshold is None:
        threshold = cal.get("abstain_threshold")
        baseline_threshold = baseline_threshold if baseline_threshold is not None else (
            cal.get("validation") or {}).get("baseline_knn_threshold")
    bk = baseline_k or params.k
    bt = baseline_temperature or params.temperature
    kw = {"batch_size": batch_size, "match": match, "progress": progress, "depth": max(bk, depth)}
    run = run_variants(engine, queries, [(params, strategy)], desc="queries", **kw)
    ood_run = run_variants(engine, ood, [(params, strategy)], desc="ood", **kw) if ood else None
    chunks = engine.bundle.chunks
    base_cls = baseline_outcomes(run, chunks, bk, bt, params.kernel, match)
    base_ret = baseline_outcomes(run, chunks, params.k, bt, params.kernel, match)
    rep = build_report(queries, run.outcomes[0], base_cls, base_ret, threshold=threshold,
                       baseline_threshold=baseline_threshold,
                       ood_soft=ood_run.outcomes[0] if ood_run else None,
                       ood_base=baseline_outcomes(ood_run, chunks, bk, bt, params.kernel, match) if ood_run else None,
                       ks=ks, depth=depth)
    rep["bundle"] = {k: v for k, v in engine.bundle.summary().items() if k in ("version_id", "path", "counts", "memory_layer", "kv_dtype", "index", "calibration")}
    rep["softknn_params"] = {**asdict(params), "rounds": strategy.rounds, "requery": strategy.requery}
    rep["baseline_params"] = {"k": bk, "temperature": bt, "kernel": params.kernel, "retrieval_k": params.k}
    cal_params = cal.get("params")
    rep["calibration_matches_params"] = cal_params is None or all(
        rep["softknn_params"].get(k) == v for k, v in cal_params.items())
    return rep, run, ood_run


# --- calibration: a validation split carved from the KB side ----------------------------------
def holdout_split(docs: list, fraction: float, seed: int = 0) -> tuple[list, list]:
    """Stratified by label: hold out round(fraction·n_label) documents of every label (≥ 1 where a
    label has ≥ 2, never all of them); unlabelled documents stay in the KB. Returns (rest, held)."""
    if not 0.0 < fraction < 1.0:
        raise InvalidInput(f"holdout fraction must be in (0, 1), got {fraction}", field="fraction")
    by_label: dict[str, list[int]] = {}
    for i, d in enumerate(docs):
        if d.label is not None:
            by_label.setdefault(d.label, []).append(i)
    rng = random.Random(seed)
    held: set[int] = set()
    for label in sorted(by_label):
        idx = by_label[label][:]
        rng.shuffle(idx)
        m = min(len(idx) - 1, max(1 if len(idx) >= 2 else 0, round(fraction * len(idx))))
        held.update(idx[:m])
    if not held:
        raise InvalidInput("no labelled documents to hold out (the KB needs labels for calibration)", field="label")
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def write_docs_jsonl(docs: list, path: Path) -> None:
    lines = [json.dumps({"id": d.doc_id, "text": d.text, "label": d.label, "metadata": d.metadata},
                        ensure_ascii=False, sort_keys=True) for d in docs]
    atomic_write_bytes(Path(path), ("\n".join(lines) + "\n").encode())


def write_calibration(bundle: Path, calibration: dict) -> dict:
    """Set the manifest's calibration section, recompute version_id, write manifest.json atomically.

    The bundle is verified first (checksums), so a corrupt bundle is never re-stamped.
    """
    bundle = Path(bundle)
    manifest = verify_bundle(bundle)
    manifest["calibration"] = calibration
    manifest["version_id"] = version_id(manifest)
    atomic_write_bytes(bundle / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
    return manifest


def calibration_record(soft_val: list[dict], base_val: list[dict], held: list[Query], params: InferParams,
                       target_loss: float, fraction: float, seed: int) -> dict:
    """Choose the threshold on validation outcomes; the record the manifest stores."""
    s = [o["score"] for o in soft_val]
    ok = [o["prediction"] == q.label for o, q in zip(soft_val, held, strict=True)]
    b = [o["score"] for o in base_val]
    b_ok = [o["prediction"] == q.label for o, q in zip(base_val, held, strict=True)]
    t = choose_threshold(s, ok, target_loss)
    bt = choose_threshold(b, b_ok, target_loss)
    return {
        "abstain_threshold": t,
        "score": "top label score: Σ_c w_db(c)·1[label_c = top] (Nadaraya–Watson)",
        "target_accuracy_loss": target_loss,
        "params": {"k": params.k, "temperature": params.temperature, "kernel": params.kernel,
                   "alpha": params.alpha, "mixing": params.mixing},
        "validation": {
            "method": f"stratified {fraction:.0%} of the labelled KB records (seed {seed}) as queries against "
                      "a bundle built from the rest",
            "n": len(held),
            "accuracy": float(np.mean(ok)),
            **{k: v for k, v in abstain_point(s, ok, t).items() if k != "threshold"},
            "baseline_knn_threshold": bt,
            "baseline_knn_accuracy": float(np.mean(b_ok)),
        },
    }
