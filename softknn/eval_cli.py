"""`softknn eval` (and `softknn calibrate`): the I/O edge of softknn.evaluation.

Registered by softknn/cli.py as `app.command("eval")(eval_command)`; this module only parses,
builds the encoder and bundle, calls softknn.evaluation, and writes the report, per-query
predictions and plots (matplotlib, Agg) under --out.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from softknn.errors import SoftKNNError

log = logging.getLogger(__name__)


# --- the validation split and its bundle ------------------------------------------------------
def prepare_validation(kb: Path, fields, bundle_manifest: dict, work: Path, encoder, *, fraction: float = 0.1,
                       seed: int = 0, layer: int | None = None, progress: bool = True):
    """Hold out a stratified slice of the KB's labelled records and build a bundle from the rest,
    with the same build settings as `bundle_manifest` (memory layer overridable, for sweeps).

    Writes work/{rest.jsonl, heldout.jsonl, split.json, bundle/}; a rerun with the same split and
    settings reuses the bundle. Returns (validation bundle path, held-out queries).
    """
    from index_builder.pipeline import BuildConfig, build_bundle
    from index_builder.reader import Fields, read_kb
    from softknn.bundle import verify_bundle
    from softknn.errors import BundleError
    from softknn.evaluation import Query, holdout_split, write_docs_jsonl

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


def calibrate(bundle_path: Path, kb: Path, fields, encoder, params, *, work: Path, fraction: float = 0.1,
              seed: int = 0, target_loss: float = 0.01, batch_size: int = 32, progress: bool = True) -> dict:
    """Choose the abstain threshold on a KB-side validation split and store it in the bundle."""
    from softknn.bundle import load_bundle, read_manifest
    from softknn.engine import Engine
    from softknn.evaluation import Strategy, baseline_outcomes, calibration_record, run_variants, write_calibration
    from softknn.retrieval import DEFAULT_TEMPERATURE

    val_path, held = prepare_validation(kb, fields, read_manifest(bundle_path), work, encoder,
                                        fraction=fraction, seed=seed, progress=progress)
    val = load_bundle(val_path, expected_fingerprint=encoder.info.fingerprint)
    engine = Engine(encoder, val)
    params = engine.resolve([params])[0]
    run = run_variants(engine, held, [(params, Strategy())], batch_size=batch_size,
                       progress=progress, desc="calibration")
    base = baseline_outcomes(run, val.chunks, params.k, DEFAULT_TEMPERATURE["dense"], params.kernel)
    record = calibration_record(run.outcomes[0], base, held, params, target_loss, fraction, seed)
    write_calibration(bundle_path, record)
    (Path(work) / "calibration.json").write_text(json.dumps(record, indent=2))
    return record


# --- writing ----------------------------------------------------------------------------------
def write_predictions(path: Path, run, base: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for q, o, b in zip(run.queries, run.outcomes[0], base, strict=True):
            f.write(json.dumps({"id": q.id, "label": q.label, "gold": q.gold,
                                "softknn": {k: o[k] for k in ("prediction", "score", "ranked", "label_scores", "memory_share")},
                                "baseline": {k: b[k] for k in ("nn1", "prediction", "score", "ranked")}},
                               ensure_ascii=False) + "\n")


def plot_abstain(rep: dict, path: Path, title: str = "") -> Path | None:
    """Answered accuracy vs rejection rate, and OOD rejection vs in-scope accuracy loss, softknn beside
    the baseline; the calibrated operating points marked."""
    cls = rep.get("classification")
    if not cls:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_ood = cls["abstain"]["n_ood"] > 0
    fig, axes = plt.subplots(1, 2 if has_ood else 1, figsize=(12 if has_ood else 6, 4.5), squeeze=False)
    styles = {"softknn": "-", "baseline_knn": "--", "softknn_gated": "-.", "baseline_knn_gated": ":"}
    ax = axes[0][0]
    for name, pts in cls["curves"].items():
        pts = [p for p in pts if p["answered_accuracy"] is not None]
        ax.plot([p["rejection_rate"] for p in pts], [p["answered_accuracy"] for p in pts], styles.get(name, "-"), label=name)
    for name in ("softknn", "baseline_knn"):
        for rule, a in cls["abstain"].get(name, {}).items():
            if a.get("answered_accuracy") is not None:
                ax.plot([a["rejection_rate"]], [a["answered_accuracy"]], "o", label=f"{name} {rule} t={a['threshold']:.3f}")
    ax.set_xlabel("in-scope rejection rate")
    ax.set_ylabel("accuracy on answered queries")
    ax.set_title("abstain trade-off")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if has_ood:
        ax = axes[0][1]
        for name, pts in cls["curves"].items():
            ax.plot([p["accuracy_loss"] for p in pts], [p["ood_rejection_rate"] for p in pts], styles.get(name, "-"), label=name)
        for name in ("softknn", "baseline_knn"):
            for rule, a in cls["abstain"].get(name, {}).items():
                ax.plot([a["accuracy_loss"]], [a["ood_rejection_rate"]], "o", label=f"{name} {rule} (calibrated)")
        ax.set_xlabel("in-scope accuracy loss (right answers rejected)")
        ax.set_ylabel("out-of-domain rejection rate")
        ax.set_xlim(0, 0.1)
        ax.set_title("rejecting out-of-domain inputs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_evidence(rep: dict, path: Path, title: str = "") -> Path | None:
    """recall@k of the gold ids among the evidence, k = 1…10, softknn beside the plain ranking."""
    ev = rep.get("evidence")
    if not ev:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, style in (("softknn", "o-"), ("baseline", "x--")):
        pts = ev["curves"][name]
        m = ev[name]
        ax.plot([p["k"] for p in pts], [p["recall"] for p in pts], style,
                label=f"{name}: nDCG@10 {m['ndcg@10']:.3f}, MRR@10 {m['mrr@10']:.3f}")
    ax.set_xlabel("k (evidence items, unique ids)")
    ax.set_ylabel("recall@k of the gold ids")
    ax.set_title(title or "evidence quality")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_retrieval(rep: dict, path: Path, title: str = "") -> Path | None:
    """Dense, lexical and hybrid side by side: evidence recall@k curves, or accuracy bars."""
    rows = rep.get("retrieval") or {}
    if len(rows) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if all("recall_curve" in r for r in rows.values()):
        for mode, r in rows.items():
            ks = [p["k"] for p in r["recall_curve"]]
            ax.plot(ks, [p["recall"] for p in r["recall_curve"]], marker="o", ms=3,
                    label=f"{mode} (nDCG@10 {r['evidence'].get('ndcg@10', float('nan')):.3f})")
        ax.set_xlabel("evidence items k")
        ax.set_ylabel("recall@k (gold passage among the evidence)")
    else:
        modes = list(rows)
        acc = [rows[m]["classification"]["accuracy"] for m in modes]
        ax.bar(modes, acc, color="#4878a8")
        for i, a in enumerate(acc):
            ax.text(i, a, f"{a:.4f}", ha="center", va="bottom")
        ax.set_ylim(min(acc) - 0.05, min(1.0, max(acc) + 0.02))
        ax.set_ylabel("accuracy")
    ax.set_title(f"retrieval side by side — {title}" if title else "retrieval side by side")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right") if ax.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, rep: dict, run, base: list[dict], *, title: str = "") -> dict:
    from softknn.evaluation import summary

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2))
    (out / "summary.json").write_text(json.dumps(summary(rep), indent=2))
    write_predictions(out / "predictions.jsonl", run, base)
    plot_abstain(rep, out / "abstain.png", title)
    plot_evidence(rep, out / "evidence.png", title)
    plot_retrieval(rep, out / "retrieval.png", title)
    return rep


def _print(rep: dict) -> None:
    cls, ev = rep.get("classification"), rep.get("evidence")
    if not rep.get("calibration_matches_params", True):
        typer.secho("warning: the bundle's abstain thresholds were calibrated with other k / temperature / kernel "
                    f"({rep['bundle']['calibration'].get('params')}); recalibrate with --calibrate-kb", fg=typer.colors.YELLOW)
    if cls:
        for name in ("softknn", "baseline_1nn", "baseline_knn"):
            m = cls[name]
            typer.echo(f"{name:13s} accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  (n={m['n']})")
        for name in ("softknn", "baseline_knn"):
            for rule, a in cls["abstain"].get(name, {}).items():
                typer.echo(f"{name:13s} abstain ({rule}) t={a['threshold']:.4f}: rejects {a['rejection_rate']:.4f} "
                           f"in-scope (accuracy loss {a['accuracy_loss']:.4f}), OOD rejection {a.get('ood_rejection_rate')}")
    if ev:
        for name in ("softknn", "baseline"):
            m = ev[name]
            typer.echo(f"{name:13s} " + "  ".join(f"{k} {v:.4f}" for k, v in m.items() if k != "n") + f"  (n={m['n']})")
    for mode, row in rep.get("retrieval", {}).items():
        parts = []
        if "classification" in row:
            parts.append(f"accuracy {row['classification']['accuracy']:.4f}")
        if "evidence" in row:
            parts += [f"{k} {row['evidence'][k]:.4f}" for k in ("ndcg@10", "recall@10", "mrr@10") if k in row["evidence"]]
        typer.echo(f"retrieval {mode:8s} τ={row['temperature']:g}  " + "  ".join(parts))


# --- commands ---------------------------------------------------------------------------------
Opt = typer.Option


def eval_command(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    queries: Annotated[Path, typer.Argument(help="query set: .jsonl/.json/.csv file or folder (builder formats)")],
    out: Annotated[Path, Opt("--out", "-o", help="report folder (report.json, summary.json, predictions.jsonl, abstain.png)")] = Path("eval-report"),
    id_field: Annotated[str, Opt(help="query id field")] = "id",
    text_field: Annotated[str, Opt(help="query text field")] = "text",
    label_field: Annotated[str, Opt(help="gold label field (classification)")] = "label",
    gold_field: Annotated[str, Opt(help="gold chunk/doc ids field: a list or one id (evidence)")] = "gold_ids",
    ood: Annotated[Optional[Path], Opt(help="out-of-domain query set (rejection at the abstain threshold)")] = None,
    ood_text_field: Annotated[Optional[str], Opt(help="text field of the OOD set (default: --text-field)")] = None,
    match: Annotated[str, Opt(help="gold ids are doc ids (doc) or chunk ids (chunk)")] = "doc",
    limit: Annotated[Optional[int], Opt(help="evaluate a seeded random subset of this many queries")] = None,
    seed: Annotated[int, Opt(help="seed of --limit and of the calibration split")] = 0,
    model: Annotated[Optional[str], Opt("--model", help="sentence-transformers model path")] = None,
    alpha: Annotated[Optional[float], Opt(help="fixed-mixing weight of the input's own attention")] = None,
    mixing: Annotated[Optional[str], Opt(help="fixed | joint")] = None,
    k: Annotated[Optional[int], Opt(help="chunks retrieved")] = None,
    temperature: Annotated[Optional[float], Opt(help="k-NN temperature τ")] = None,
    kernel: Annotated[Optional[str], Opt(help="softmax | epanechnikov | uniform")] = None,
    retrieval: Annotated[Optional[str], Opt(help="hybrid | dense | lexical (default: hybrid where the bundle has a "
                                                 "lexical index)")] = None,
    lexical_weight: Annotated[Optional[float], Opt(help="λ of the hybrid similarity")] = None,
    compare: Annotated[str, Opt(help="retrievals reported side by side in the same run (comma-separated; "
                                     "'' for none)")] = "dense,lexical,hybrid",
    rounds: Annotated[int, Opt(help="2: retrieve again with the fused embedding (labels + evidence from round 2)")] = 1,
    requery: Annotated[str, Opt(help="round-2 query: fused (e') or sum (e_q + e')")] = "fused",
    baseline_k: Annotated[Optional[int], Opt(help="weighted k-NN baseline k (default: --k)")] = None,
    baseline_temperature: Annotated[Optional[float], Opt(help="weighted k-NN baseline τ (default: --temperature)")] = None,
    threshold: Annotated[Optional[float], Opt(help="abstain threshold to evaluate (default: the bundle's calibrated one)")] = None,
    calibrate_kb: Annotated[Optional[Path], Opt(help="first calibrate: the KB the bundle was built from (its labelled records are split)")] = None,
    calibrate_fraction: Annotated[float, Opt(help="share of each label held out for calibration")] = 0.1,
    target_loss: Annotated[float, Opt(help="in-scope accuracy the threshold may cost on validation")] = 0.01,
    calibration_work: Annotated[Optional[Path], Opt(help="folder for the split and validation bundle (default: OUT/calibration; reused when it matches)")] = None,
    kb_id_field: Annotated[str, Opt(help="KB id field (with --calibrate-kb)")] = "id",
    kb_text_field: Annotated[str, Opt(help="KB text field (with --calibrate-kb)")] = "text",
    kb_label_field: Annotated[str, Opt(help="KB label field (with --calibrate-kb)")] = "label",
    batch_size: Annotated[int, Opt(help="queries per batch")] = 32,
    progress: Annotated[bool, Opt(help="show progress bars")] = True,
) -> None:
    """Evaluate BUNDLE on QUERIES beside the plain embedding k-NN baseline: accuracy, macro-F1, abstain
    trade-off, OOD rejection, recall@k / nDCG@10 / MRR@10 of the evidence. Writes a JSON report and plots."""
    from index_builder.reader import Fields
    from softknn.bundle import load_bundle
    from softknn.cli import _encoder, _fail, _settings
    from softknn.engine import Engine, InferParams
    from softknn.evaluation import Strategy, baseline_outcomes, evaluate, read_queries, sample

    try:
        settings = _settings(model__name=model)
        d = settings.defaults
        params = InferParams(alpha=d.alpha if alpha is None else alpha, mixing=mixing or d.mixing, k=k or d.k,
                             temperature=temperature or d.temperature, kernel=kernel or d.kernel,
                             hybrid_pool=d.hybrid_pool, retrieval=retrieval or d.retrieval,
                             lexical_weight=d.lexical_weight if lexical_weight is None else lexical_weight,
                             candidates=d.candidates).validate()
        wanted = [r.strip() for r in compare.split(",") if r.strip()]
        strategy = Strategy(rounds, requery).validate()
        qs = sample(read_queries(queries, Fields(id_field, text_field, label_field), gold_field), limit, seed)
        ood_qs = read_queries(ood, Fields(id_field, ood_text_field or text_field, None), None) if ood else None
        encoder = _encoder(settings)
        if calibrate_kb is not None:
            record = calibrate(bundle, calibrate_kb, Fields(kb_id_field, kb_text_field, kb_label_field), encoder,
                               params, work=calibration_work or out / "calibration", fraction=calibrate_fraction, seed=seed,
                               target_loss=target_loss, batch_size=batch_size, progress=progress)
            v = record["validation"]["score_rule"]
            typer.echo(f"calibrated {bundle}: abstain threshold {record['abstain_threshold']:.4f} "
                       f"(validation n={record['validation']['n']}: loss {v['accuracy_loss']:.4f}, "
                       f"rejects {v['rejection_rate']:.4f})")
        b = load_bundle(bundle, expected_fingerprint=encoder.info.fingerprint, use_gpu=settings.use_gpu_index)
        engine = Engine(encoder, b)
        t0 = time.perf_counter()
        served = [r for r in wanted if r == "dense" or b.lexical is not None]  # an old bundle: dense only
        rep, run, _ = evaluate(engine, qs, params, strategy, ood=ood_qs, baseline_k=baseline_k,
                               baseline_temperature=baseline_temperature, threshold=threshold, match=match,
                               batch_size=batch_size, progress=progress, compare=served)
        rep["queries"] = {"path": str(queries), "n": len(qs), "limit": limit, "seed": seed,
                          "ood": str(ood) if ood else None, "n_ood": len(ood_qs or [])}
        rep["seconds"] = round(time.perf_counter() - t0, 1)
        base = baseline_outcomes(run, b.chunks, rep["baseline_params"]["k"], rep["baseline_params"]["temperature"],
                                 params.kernel, match)
        write_report(out, rep, run, base, title=f"{Path(bundle).name} on {Path(queries).name}")
    except SoftKNNError as e:
        _fail(e)
    _print(rep)
    typer.echo(f"report: {out / 'report.json'}")


def calibrate_command(
    bundle: Annotated[Path, typer.Argument(help="bundle directory (its manifest gets the threshold)")],
    kb: Annotated[Path, typer.Argument(help="the KB the bundle was built from")],
    work: Annotated[Path, Opt("--work", help="folder for the split and the validation bundle")] = Path("calibration"),
    id_field: Annotated[str, Opt(help="KB id field")] = "id",
    text_field: Annotated[str, Opt(help="KB text field")] = "text",
    label_field: Annotated[str, Opt(help="KB label field")] = "label",
    fraction: Annotated[float, Opt(help="share of each label held out")] = 0.1,
    seed: Annotated[int, Opt(help="split seed")] = 0,
    target_loss: Annotated[float, Opt(help="in-scope accuracy the threshold may cost on validation")] = 0.01,
    model: Annotated[Optional[str], Opt("--model", help="sentence-transformers model path")] = None,
    progress: Annotated[bool, Opt(help="show progress bars")] = True,
) -> None:
    """Calibrate BUNDLE's abstain threshold on a validation split of KB (never the test queries)."""
    from index_builder.reader import Fields
    from softknn.cli import _encoder, _fail, _settings
    from softknn.engine import InferParams

    try:
        settings = _settings(model__name=model)
        d = settings.defaults
        params = InferParams(alpha=d.alpha, mixing=d.mixing, k=d.k, temperature=d.temperature, kernel=d.kernel)
        record = calibrate(bundle, kb, Fields(id_field, text_field, label_field), _encoder(settings), params,
                           work=work, fraction=fraction, seed=seed, target_loss=target_loss, progress=progress)
    except SoftKNNError as e:
        _fail(e)
    typer.echo(json.dumps(record, indent=2))



if __name__ == "__main__":  # `python -m softknn.eval_cli eval ...` works before cli.py registers the commands
    _app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    _app.command("eval")(eval_command)
    _app.command("calibrate")(calibrate_command)
    logging.basicConfig(level=logging.WARNING)
    _app()
