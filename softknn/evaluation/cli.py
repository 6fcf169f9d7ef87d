"""`softknn eval` and `softknn calibrate`: the I/O edge of the evaluation app.

Registered by softknn/cli.py as `app.command("eval")(eval_command)`, and runnable alone as
`python -m softknn.evaluation.cli eval ...`; this module parses, builds the encoder and bundles, calls
softknn.evaluation.run (and softknn.evaluation.holdout for `calibrate` / --calibrate-kb), and writes the report, per-query predictions and plots (softknn.evaluation.report) under --out.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from softknn.common.console import fail
from softknn.common.errors import SoftKNNError
from softknn.common.options import table_options
from softknn.common.table import InferParams
from softknn.params import infer_params, settings_from

log = logging.getLogger(__name__)


def print_report(rep: dict) -> None:
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


@table_options(InferParams, "alpha", "mixing", "k", "knn_temperature", "kernel", "retrieval", "lexical_weight")
def eval_command(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    queries: Annotated[Path, typer.Argument(help="query set: .jsonl/.json/.csv file or folder (builder formats)")],
    out: Annotated[Path, Opt("--out", "-o", help="report folder (report.json, summary.json, predictions.jsonl, abstain.png)")] = Path("eval-report"),
    id_field: Annotated[str, Opt(help="query id field")] = "id",
    text_field: Annotated[str, Opt(help="query text field")] = "text",
    label_field: Annotated[str, Opt(help="gold label field (classification)")] = "label",
    gold_field: Annotated[str, Opt(help="gold chunk/doc ids field: a list or one id (evidence)")] = "gold_ids",
    ood: Annotated[Path | None, Opt(help="out-of-domain query set (rejection at the abstain threshold)")] = None,
    ood_text_field: Annotated[str | None, Opt(help="text field of the OOD set (default: --text-field)")] = None,
    match: Annotated[str, Opt(help="gold ids are doc ids (doc) or chunk ids (chunk)")] = "doc",
    limit: Annotated[int | None, Opt(help="evaluate a seeded random subset of this many queries")] = None,
    seed: Annotated[int, Opt(help="seed of --limit and of the calibration split")] = 0,
    model: Annotated[str | None, Opt("--model", help="sentence-transformers model path")] = None,
    compare: Annotated[str, Opt(help="retrievals reported side by side in the same run (comma-separated; "
                                     "'' for none)")] = "dense,lexical,hybrid",
    rounds: Annotated[int, Opt(help="2: retrieve again with the fused embedding (labels + evidence from round 2)")] = 1,
    requery: Annotated[str, Opt(help="round-2 query: fused (e') or sum (e_q + e')")] = "fused",
    baseline_k: Annotated[int | None, Opt(help="weighted k-NN baseline k (default: --k)")] = None,
    baseline_temperature: Annotated[float | None, Opt(help="weighted k-NN baseline τ (default: --knn-temperature)")] = None,
    threshold: Annotated[float | None, Opt(help="abstain threshold to evaluate (default: the bundle's calibrated one)")] = None,
    calibrate_kb: Annotated[Path | None, Opt(help="first calibrate: the KB the bundle was built from (its labelled records are split)")] = None,
    calibrate_fraction: Annotated[float, Opt(help="share of each label held out for calibration")] = 0.1,
    target_loss: Annotated[float, Opt(help="in-scope accuracy the threshold may cost on validation")] = 0.01,
    calibration_work: Annotated[Path | None, Opt(help="folder for the split and validation bundle (default: OUT/calibration; reused when it matches)")] = None,
    kb_id_field: Annotated[str, Opt(help="KB id field (with --calibrate-kb)")] = "id",
    kb_text_field: Annotated[str, Opt(help="KB text field (with --calibrate-kb)")] = "text",
    kb_label_field: Annotated[str, Opt(help="KB label field (with --calibrate-kb)")] = "label",
    batch_size: Annotated[int, Opt(help="queries per batch")] = 32,
    progress: Annotated[bool, Opt(help="show progress bars")] = True,
    given: dict | None = None,
) -> None:
    """Evaluate BUNDLE on QUERIES beside the plain embedding k-NN baseline: accuracy, macro-F1, abstain
    trade-off, OOD rejection, recall@k / nDCG@10 / MRR@10 of the evidence. Writes a JSON report and plots."""
    from softknn.common.console import need_bundle

    need_bundle(bundle)
    from softknn.evaluation.holdout import calibrate
    from softknn.evaluation.report import write_report
    from softknn.evaluation.run import Strategy, baseline_outcomes, evaluate, read_queries, sample
    from softknn.index_builder.reader import Fields
    from softknn.infer.engine import Engine
    from softknn.model.runtime import encoder_for
    from softknn.storage.bundle import load_bundle

    try:
        settings = settings_from(model__name=model)
        params = infer_params(settings, given or {})
        wanted = [r.strip() for r in compare.split(",") if r.strip()]
        strategy = Strategy(rounds, requery).validate()
        qs = sample(read_queries(queries, Fields(id_field, text_field, label_field), gold_field), limit, seed)
        ood_qs = read_queries(ood, Fields(id_field, ood_text_field or text_field, None), None) if ood else None
        encoder = encoder_for(settings)
        if calibrate_kb is not None:
            record = calibrate(bundle, calibrate_kb, Fields(kb_id_field, kb_text_field, kb_label_field), encoder,
                               params, work=calibration_work or out / "calibration", fraction=calibrate_fraction, seed=seed,
                               target_loss=target_loss, batch_size=batch_size, progress=progress)
            v = record["validation"]["score_rule"]
            if record["validation"].get("too_small"):
                typer.secho(f"warning: {record['validation']['too_small']}", fg=typer.colors.YELLOW, err=True)
            else:
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
        fail(e)
    print_report(rep)
    typer.echo(f"report: {out / 'report.json'}")


def calibrate_command(
    bundle: Annotated[Path, typer.Argument(help="bundle directory (its manifest gets the threshold)")],
    kb: Annotated[Path, typer.Argument(help="the KB the bundle was built from")],
    work: Annotated[Path, Opt("--work", help="folder for the split and the validation bundle")] = Path("calibration"),
    id_field: Annotated[str | None, Opt(help="KB id field [default: the one the bundle was built with]")] = None,
    text_field: Annotated[str | None, Opt(help="KB text field [default: the one the bundle was built with]")] = None,
    label_field: Annotated[str | None, Opt(help="KB label field [default: the one the bundle was built with]")] = None,
    fraction: Annotated[float, Opt(help="share of each label held out")] = 0.1,
    seed: Annotated[int, Opt(help="split seed")] = 0,
    target_loss: Annotated[float, Opt(help="in-scope accuracy the threshold may cost on validation")] = 0.01,
    min_validation_n: Annotated[int | None, Opt("--min-validation", help="fewest validation queries a threshold "
                                                   "is set from [default: ⌈1/target-loss⌉, at most 100]")] = None,
    model: Annotated[str | None, Opt("--model", help="sentence-transformers model path")] = None,
    progress: Annotated[bool, Opt(help="show progress bars")] = True,
) -> None:
    """Calibrate BUNDLE's abstain threshold on a validation split of KB (never the test queries).

    The field names default to those stored in the bundle's manifest at build time. Below
    --min-validation queries (default ⌈1/target_loss⌉) no threshold is set (see small_validation)."""
    from softknn.common.console import need_bundle

    need_bundle(bundle)
    from softknn.evaluation.holdout import calibrate
    from softknn.index_builder.reader import Fields
    from softknn.model.runtime import encoder_for
    from softknn.storage.layout import read_manifest

    try:
        built = read_manifest(bundle)["build"].get("fields") or {}
        fields = Fields(id_field or built.get("id", "id"), text_field or built.get("text", "text"),
                        label_field or built.get("label", "label"))
        settings = settings_from(model__name=model)
        params = infer_params(settings, {})
        record = calibrate(bundle, kb, fields, encoder_for(settings), params,
                           work=work, fraction=fraction, seed=seed, target_loss=target_loss, progress=progress,
                           min_n=min_validation_n)
    except SoftKNNError as e:
        fail(e)
    typer.echo(json.dumps(record, indent=2))
    v = record["validation"]
    if v.get("too_small"):
        typer.secho(f"warning: {v['too_small']}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"calibrated {bundle} on {v['n']} validation queries (fields: text {fields.text!r}, label "
               f"{fields.label!r}): abstain threshold {record['abstain_threshold']}", err=True)

app = typer.Typer(help="softknn's evaluation: `eval` and `calibrate` (also `softknn eval`, `softknn calibrate`).",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
app.command("eval")(eval_command)
app.command("calibrate")(calibrate_command)

if __name__ == "__main__":  # `python -m softknn.evaluation.cli eval ...`
    logging.basicConfig(level=logging.WARNING)
    app()
