"""The held-out calibration workflow: a stratified validation split carved from the KB side, a
bundle built from the rest (with the bundle's own build settings), the held-out records run as
queries against it, and the abstain thresholds chosen on their outcomes (softknn.retrieval.calibration's
rules) written into the bundle's manifest. `softknn calibrate DIR KB` and `softknn eval
--calibrate-kb` run it (softknn.evaluation.cli).

This app is its one home: it builds the second bundle through the builder (index_builder), which
in turn never imports the evaluation (tests/test_layering.py keeps the apps acyclic); the
builder's own calibration is the leave-one-out in the core (softknn.retrieval.calibration).
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path

import numpy as np

from softknn.common.errors import BundleError, InvalidInput
from softknn.evaluation.run import Query, Strategy, baseline_outcomes, run_variants
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.index_builder.reader import Fields, read_kb
from softknn.infer.engine import Engine, InferParams
from softknn.retrieval.calibration import RULES, abstain_point, calibrate_rules, gated_scores
from softknn.retrieval.scoring import DEFAULT_TEMPERATURE
from softknn.storage.bundle import load_bundle, write_calibration
from softknn.storage.layout import atomic_write_bytes, read_manifest, verify_bundle

log = logging.getLogger(__name__)


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


def _calibrated(outs: list[dict], held: list[Query], target_loss: float) -> dict:
    ok = [o["prediction"] == q.label for o, q in zip(outs, held, strict=True)]
    scores, sims = [o["score"] for o in outs], [o["max_similarity"] for o in outs]
    r = calibrate_rules(scores, sims, ok, target_loss)
    g = r["gated"]
    return {
        "abstain_threshold": r["score"]["threshold"],
        "min_similarity": g["min_similarity"],
        "abstain_threshold_gated": g["threshold"],
        "validation": {
            "accuracy": float(np.mean(ok)),
            "score_rule": {k: v for k, v in abstain_point(scores, ok, r["score"]["threshold"]).items() if k != "threshold"},
            "gated_rule": {k: v for k, v in abstain_point(gated_scores(scores, sims, g["min_similarity"]), ok,
                                                          g["threshold"]).items() if k != "threshold"},
        },
    }


def calibration_record(soft_val: list[dict], base_val: list[dict], held: list[Query], params: InferParams,
                       target_loss: float, fraction: float, seed: int) -> dict:
    """Choose the thresholds on validation outcomes; the record the manifest's calibration holds.

    The engine applies the gated rule (RULES): `min_similarity` with `abstain_threshold_gated`;
    `abstain_threshold` is the score-only rule's t (softknn.infer.engine.Engine._predict).
    """
    soft = _calibrated(soft_val, held, target_loss)
    return {
        **{k: soft[k] for k in ("abstain_threshold", "min_similarity", "abstain_threshold_gated")},
        "rules": RULES,
        "score": "top label score: Σ_c w_db(c)·1[label_c = top] (Nadaraya–Watson); s_1 = max_c e_q·e_c",
        "target_accuracy_loss": target_loss,
        "params": {"k": params.k, "temperature": params.temperature, "kernel": params.kernel,
                   "retrieval": params.retrieval,
                   **({"lexical_weight": params.lexical_weight} if params.retrieval == "hybrid" else {})},
        "validation": {
            "method": f"stratified {fraction:.0%} of the labelled KB records (seed {seed}) as queries against "
                      "a bundle built from the rest",
            "n": len(held),
            **soft["validation"],
        },
        "baseline_knn": _calibrated(base_val, held, target_loss),
    }


def prepare_validation(kb: Path, fields, bundle_manifest: dict, work: Path, encoder, *, fraction: float = 0.1,
                       seed: int = 0, layer: int | None = None, progress: bool = True):
    """Hold out a stratified slice of the KB's labelled records and build a bundle from the rest,
    with the same build settings as `bundle_manifest` (memory layer overridable, for sweeps).

    Writes work/{rest.jsonl, heldout.jsonl, split.json, bundle/}; a rerun with the same split and
    settings reuses the bundle. Returns (validation bundle path, held-out queries).
    """
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    docs = read_kb(Path(kb), fields)
    rest, held = holdout_split(docs, fraction, seed)
    b = bundle_manifest["build"]
    cfg = BuildConfig(layer=bundle_manifest["memory_layer"] if layer is None else layer,
                      index_type=bundle_manifest["index"]["kind"], chunk_tokens=b["chunk_tokens"],
                      overlap=b["overlap"], batch_size=b["batch_size"], kv_dtype=bundle_manifest["kv_dtype"],
                      memory=bundle_manifest.get("memory", "kv"),
                      fields=Fields(), lexical=bool(bundle_manifest.get("lexical")))
    split = {"kb": str(Path(kb).resolve()), "fraction": fraction, "seed": seed, "n_rest": len(rest),
             "n_held": len(held), "layer": cfg.layer, "kv_dtype": cfg.kv_dtype, "chunk_tokens": cfg.chunk_tokens,
             "overlap": cfg.overlap, "index": cfg.index_type, "model": bundle_manifest["model"]["fingerprint"],
             "lexical": cfg.lexical}
    out = work / "bundle"
    reuse = False
    if (work / "split.json").is_file() and json.loads((work / "split.json").read_text()) == split:
        try:
            verify_bundle(out)
            reuse = True
        except BundleError as e:
            log.info("rebuilding %s: %s", out, e)
    if not reuse:
        write_docs_jsonl(rest, work / "rest.jsonl")
        write_docs_jsonl(held, work / "heldout.jsonl")
        build_bundle(work / "rest.jsonl", out, cfg, encoder, force=True, progress=progress)
        (work / "split.json").write_text(json.dumps(split, indent=2))
    return out, [Query(d.doc_id, d.text, d.label) for d in held]


def min_validation(target_loss: float) -> int:
    """The fewest validation queries a threshold is set from by default: ⌈1/target_loss⌉ (100 at
    the default 1%, never more than 100).

    The threshold is the largest t whose in-scope loss stays within target_loss, and each right
    answer it rejects costs 1/n; below 1/target_loss it can reject none, so it lands on the lowest
    right answer's score, an extreme of a tiny sample (with a handful of
    rows it sat so high that in-scope questions were refused). A zero budget is treated as 1% here."""
    return math.ceil(1 / max(target_loss, 0.01) - 1e-9)


def small_validation(record: dict, need: int) -> dict:
    """The record as stored: unchanged with at least `need` validation queries; with fewer the
    thresholds are not set (the engine then answers every query, as an uncalibrated bundle does),
    the ones computed kept under validation.unapplied, and validation.too_small says why."""
    n = record["validation"]["n"]
    record["validation"]["min_n"] = need
    if n >= need:
        return record
    keys = ("abstain_threshold", "min_similarity", "abstain_threshold_gated")
    record["validation"]["unapplied"] = {k: record[k] for k in keys}
    record["validation"]["too_small"] = (
        f"only {n} validation queries (< {need}, see --min-validation): too few to set an abstain threshold, "
        f"so none is set and every query is answered; calibrate on a larger labelled KB (or a larger "
        f"--fraction), or pass a threshold per request")
    return {**record, **dict.fromkeys(keys)}


def calibrate(bundle_path: Path, kb: Path, fields, encoder, params, *, work: Path, fraction: float = 0.1,
              seed: int = 0, target_loss: float = 0.01, batch_size: int = 32, progress: bool = True,
              min_n: int | None = None) -> dict:
    """Choose the abstain threshold on a KB-side validation split and store it in the bundle; with
    fewer than `min_n` validation queries (default min_validation) store none (small_validation)."""
    val_path, held = prepare_validation(kb, fields, read_manifest(bundle_path), work, encoder,
                                        fraction=fraction, seed=seed, progress=progress)
    val = load_bundle(val_path, expected_fingerprint=encoder.info.fingerprint)
    engine = Engine(encoder, val)
    params = engine.resolve([params])[0]
    run = run_variants(engine, held, [(params, Strategy())], batch_size=batch_size,
                       progress=progress, desc="calibration")
    base = baseline_outcomes(run, val.chunks, params.k, DEFAULT_TEMPERATURE["dense"], params.kernel)
    record = small_validation(calibration_record(run.outcomes[0], base, held, params, target_loss, fraction, seed),
                              min_validation(target_loss) if min_n is None else min_n)
    write_calibration(bundle_path, record)
    (Path(work) / "calibration.json").write_text(json.dumps(record, indent=2))
    return record
