"""A bundle on a query set, beside the plain sentence-embedding k-NN baseline: the run and the report.

One pass per batch of queries feeds both systems: the plain forward gives e_q, whose FAISS top-K
is the baseline (1-NN, weighted k-NN labels; ranking by similarity s = e_q·e_c) and the engine's
retrieval R; the fused pass gives softknn's labels (Nadaraya–Watson over w_db, or over the
second-round w_db when the fused embedding is used to retrieve again) and evidence order.
The metrics (recall@k, nDCG@k, MRR@k, accuracy, macro-F1, the abstain trade-off) are
softknn.evaluation.metrics; the report's files and plots are softknn.evaluation.report and softknn.evaluation.plots; the
held-out calibration, which runs these on a validation split, is softknn.evaluation.holdout.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from softknn.common.errors import InvalidInput, KBFormatError
from softknn.evaluation.metrics import (
    RULES,
    abstain_curve,
    abstain_point,
    auroc,
    classification_metrics,
    gated_scores,
    rejection_rate,
    retrieval_metrics,
)
from softknn.index_builder.reader import Fields, read_kb
from softknn.infer.engine import Engine, InferParams
from softknn.infer.results import InferResult
from softknn.model.attention import knn_weights
from softknn.retrieval.scoring import DEFAULT_TEMPERATURE, RETRIEVALS

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


def ranked_ids(items: list[tuple[str, str]], match: str) -> list[str]:
    """Unique ids in order from (chunk_id, doc_id) pairs, by `match` (first occurrence kept)."""
    seen: dict[str, None] = {}
    for chunk_id, doc_id in items:
        seen.setdefault(doc_id if match == "doc" else chunk_id, None)
    return list(seen)


def _outcome(r: InferResult, match: str) -> dict:
    scores = r.label_scores or {}
    top = next(iter(scores.items()), (None, 0.0))
    ev = r.evidence
    mass: dict[str, float] = {}  # the memory-mass readout Σ_c share(c)·onehot(label_c) (≠ w_db in joint)
    for e in ev:
        if e.label is not None:
            mass[e.label] = mass.get(e.label, 0.0) + e.mass_share
    return {
        "prediction": top[0],  # forced: the abstain rule is applied afterwards with its threshold
        "score": float(top[1]),
        "mass_prediction": min(mass, key=lambda c: (-mass[c], c)) if mass else None,
        "max_similarity": r.diagnostics.nearest_similarity,  # s_1 = max e_q·e_c (the abstain gate's)
        "ranked": ranked_ids([(e.chunk_id, e.doc_id) for e in ev], match),
        "label_scores": dict(list(scores.items())[:3]),
        "items": [(e.chunk_id, e.doc_id, e.similarity, e.mass_share) for e in ev],
        "memory_share": r.diagnostics.memory_share,
        "w_db_effective_k": r.diagnostics.w_db_effective_k,
    }


def _fused(engine: Engine, batch, plain, xq: np.ndarray, params: InferParams, strategy: Strategy) -> list[InferResult]:
    """Engine.infer's retrieve + fuse on a shared plain pass (tests check it equals infer); round 2 optional."""
    ps = engine.resolve([params] * len(xq))
    res = engine.fuse(batch, plain, engine.retrieve(xq, ps, batch.texts), ps)
    if strategy.rounds == 2:
        e1 = np.asarray([r.embedding for r in res], dtype=np.float32)  # (B, D) fused embeddings
        xq2 = e1 if strategy.requery == "fused" else xq + e1
        xq2 = xq2 / np.linalg.norm(xq2, axis=1, keepdims=True)
        res = engine.fuse(batch, plain, engine.retrieve(xq2, ps, batch.texts), ps)
    return res


def effective_params(p: InferParams) -> InferParams:
    """What an evaluation runs: every retrieved chunk returned as evidence, long inputs cut, no
    abstention inside the engine (the rules are applied afterwards, from the forced prediction)."""
    return replace(p, truncate=True, evidence=max(p.k, p.evidence), abstain_threshold=0.0).validate()


def run_variants(engine: Engine, queries: list[Query], variants: list[tuple[InferParams, Strategy]], *,
                 depth: int = 64, batch_size: int = 32, match: str = "doc", progress: bool = True,
                 desc: str = "eval") -> Run:
    """Run every variant over `queries` (batched, shortest first to pad less) sharing one plain pass."""
    if match not in MATCH:
        raise InvalidInput(f"match must be one of {MATCH}, got {match!r}", field="match")
    if not queries:
        raise InvalidInput("no queries to evaluate", field="queries")
    variants = [(effective_params(p), s.validate()) for p, s in variants]
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
        plain = enc.forward_plain(batch, keep_hidden=True, capture_layer=engine.layer)  # as Engine._infer
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
            "ranked": ranked_ids([(chunks[r]["chunk_id"], chunks[r]["doc_id"]) for r in ids.tolist() if r >= 0], match),
        })
    return out


def _rule_points(outs: list[dict], correct: list[bool], rules: dict, ood: list[dict] | None) -> dict:
    out = {}
    for name, r in rules.items():
        t, s_min = r.get("threshold"), r.get("min_similarity")
        if t is None:
            continue
        g = gated_scores([o["score"] for o in outs], [o["max_similarity"] for o in outs], s_min)
        out[name] = {**abstain_point(g, correct, t), "min_similarity": s_min}
        if ood is not None:
            out[name]["ood_rejection_rate"] = rejection_rate(
                gated_scores([o["score"] for o in ood], [o["max_similarity"] for o in ood], s_min), t)
    return out


def _curve(outs: list[dict], correct: list[bool], ood: list[dict] | None, s_min: float | None = None) -> list[dict]:
    g = gated_scores([o["score"] for o in outs], [o["max_similarity"] for o in outs], s_min)
    pts = abstain_curve(g, correct)
    if ood is not None:
        go = gated_scores([o["score"] for o in ood], [o["max_similarity"] for o in ood], s_min)
        for p in pts:
            p["ood_rejection_rate"] = rejection_rate(go, p["threshold"])
    return pts


# --- the report -------------------------------------------------------------------------------
def build_report(queries: list[Query], soft: list[dict], base_cls: list[dict], base_ret: list[dict], *,
                 rules: dict | None = None, ood_soft: list[dict] | None = None, ood_base: list[dict] | None = None,
                 ks: Sequence[int] = (1, 5, 10), depth: int = 10) -> dict:
    """Classification (labelled queries) and evidence (queries with gold ids), softknn beside baseline.

    soft / base_cls / base_ret / ood_*: outcome dicts per query (run_variants, baseline_outcomes);
    rules: {"softknn"|"baseline_knn": {"score"|"gated": {"threshold", "min_similarity"}}}.
    """
    rules = rules or {}
    rep: dict = {"n_queries": len(queries)}
    lab = [i for i, q in enumerate(queries) if q.label is not None]
    if lab:
        gold = [queries[i].label for i in lab]
        systems = {"softknn": [soft[i] for i in lab], "baseline_knn": [base_cls[i] for i in lab]}
        oods = {"softknn": ood_soft, "baseline_knn": ood_base}
        cls: dict = {"n": len(lab), "softknn": classification_metrics(gold, [o["prediction"] for o in systems["softknn"]]),
                     "baseline_1nn": classification_metrics(gold, [base_cls[i]["nn1"] for i in lab]),
                     "baseline_knn": classification_metrics(gold, [o["prediction"] for o in systems["baseline_knn"]])}
        ab: dict = {"rules": RULES, "n_ood": len(ood_soft) if ood_soft is not None else 0}
        curves: dict = {}
        for name, outs in systems.items():
            ok = [o["prediction"] == g for o, g in zip(outs, gold, strict=True)]
            ab[name] = _rule_points(outs, ok, rules.get(name, {}), oods[name])
            curves[name] = _curve(outs, ok, oods[name])
            s_min = rules.get(name, {}).get("gated", {}).get("min_similarity")
            if s_min is not None:
                curves[f"{name}_gated"] = _curve(outs, ok, oods[name], s_min)
        if ood_soft is not None:
            ab["ood_auroc"] = {"top_label_score": auroc([o["score"] for o in systems["softknn"]], [o["score"] for o in ood_soft]),
                               "max_similarity": auroc([o["max_similarity"] for o in systems["baseline_knn"]],
                                                       [o["max_similarity"] for o in ood_base])}
        rep["classification"] = {**cls, "abstain": ab, "curves": curves}
    gold_ids = [q.gold for q in queries]
    if any(gold_ids):
        ranked = {"softknn": [o["ranked"] for o in soft], "baseline": [o["ranked"] for o in base_ret]}
        ev: dict = {name: retrieval_metrics(r, gold_ids, ks, depth) for name, r in ranked.items()}
        every = range(1, depth + 1)
        ev["curves"] = {name: [{"k": k, "recall": m[f"recall@{k}"]} for k in every]
                        for name, m in ((n, retrieval_metrics(r, gold_ids, every, depth)) for n, r in ranked.items())}
        rep["evidence"] = ev
    return rep


def rules_from_calibration(cal: dict) -> dict:
    """The thresholds a bundle's calibration section holds, in build_report's `rules` shape."""
    out: dict = {}
    for name in ("softknn", "baseline_knn"):
        src = cal if name == "softknn" else cal.get("baseline_knn") or {}
        if src.get("abstain_threshold") is not None:
            out.setdefault(name, {})["score"] = {"threshold": src["abstain_threshold"]}
        if src.get("min_similarity") is not None:
            out.setdefault(name, {})["gated"] = {"threshold": src["abstain_threshold_gated"],
                                                 "min_similarity": src["min_similarity"]}
    return out


def retrieval_comparison(queries: list[Query], run: Run, ks: Sequence[int], depth: int) -> dict:
    """Per retrieval variant of the run (dense, lexical, hybrid): accuracy and evidence metrics."""
    out: dict = {}
    lab = [i for i, q in enumerate(queries) if q.label is not None]
    gold_ids = [q.gold for q in queries]
    for (p, _), outs in zip(run.variants, run.outcomes, strict=True):
        row: dict = {"temperature": p.temperature, "lexical_weight": p.lexical_weight if p.retrieval == "hybrid" else None}
        if lab:
            row["classification"] = classification_metrics([queries[i].label for i in lab],
                                                           [outs[i]["prediction"] for i in lab])
        if any(gold_ids):
            row["evidence"] = retrieval_metrics([o["ranked"] for o in outs], gold_ids, ks, depth)
            row["recall_curve"] = [{"k": k, "recall": v} for k, v in zip(
                range(1, depth + 1), (retrieval_metrics([o["ranked"] for o in outs], gold_ids, [k], depth)[f"recall@{k}"]
                                      for k in range(1, depth + 1)), strict=True)]
        out[p.retrieval] = row
    return out


def evaluate(engine: Engine, queries: list[Query], params: InferParams, strategy: Strategy = Strategy(), *,
             ood: list[Query] | None = None, baseline_k: int | None = None, baseline_temperature: float | None = None,
             threshold: float | None = None, ks: Sequence[int] = (1, 5, 10), depth: int = 10, match: str = "doc",
             batch_size: int = 32, progress: bool = True,
             compare: Sequence[str] | None = None) -> tuple[dict, Run, Run | None]:
    """Run softknn (params, strategy) and the plain baseline over queries (and OOD queries); build the report.

    Abstain thresholds come from the bundle's calibration; `threshold` overrides the engine rule's t.
    `compare`: other retrievals (dense, lexical, hybrid) run in the same pass over the queries and
    reported side by side under "retrieval" (default: every one the bundle serves).
    """
    params = engine.resolve([params])[0]
    cal = engine.bundle.manifest.raw.get("calibration") or {}
    rules = rules_from_calibration(cal)
    if threshold is not None:
        rules.setdefault("softknn", {})["score"] = {"threshold": threshold}
    bk = baseline_k or params.k
    bt = baseline_temperature or DEFAULT_TEMPERATURE["dense"]  # the baseline is the plain dense k-NN
    kw = {"batch_size": batch_size, "match": match, "progress": progress, "depth": max(bk, depth)}
    if compare is None:
        compare = RETRIEVALS if engine.bundle.lexical is not None else ("dense",)
    others = [replace(params, retrieval=r, temperature=None if r != params.retrieval else params.temperature)
              for r in compare if r != params.retrieval]
    run = run_variants(engine, queries, [(params, strategy)] + [(p, strategy) for p in engine.resolve(others)],
                       desc="queries", **kw)
    ood_run = run_variants(engine, ood, [(params, strategy)], desc="ood", **kw) if ood else None
    chunks = engine.bundle.chunks
    rep = build_report(queries, run.outcomes[0], baseline_outcomes(run, chunks, bk, bt, params.kernel, match),
                       baseline_outcomes(run, chunks, params.k, bt, params.kernel, match), rules=rules,
                       ood_soft=ood_run.outcomes[0] if ood_run else None,
                       ood_base=baseline_outcomes(ood_run, chunks, bk, bt, params.kernel, match) if ood_run else None,
                       ks=ks, depth=depth)
    keep = ("version_id", "path", "counts", "memory_layer", "kv_dtype", "index", "calibration")
    rep["retrieval"] = retrieval_comparison(queries, run, ks, depth)
    keep = keep + ("lexical",)
    rep["bundle"] = {k: v for k, v in engine.bundle.summary().items() if k in keep}
    rep["model"] = {"name": engine.encoder.info.name, "fingerprint": engine.encoder.info.fingerprint}
    rep["softknn_params"] = {**asdict(effective_params(params)), "rounds": strategy.rounds, "requery": strategy.requery}
    rep["baseline_params"] = {"k": bk, "temperature": bt, "kernel": params.kernel, "retrieval_k": params.k}
    cal_params = cal.get("params")
    rep["calibration_matches_params"] = cal_params is None or all(
        rep["softknn_params"].get(k) == v for k, v in cal_params.items())
    return rep, run, ood_run
