"""The evaluation report on disk: report.json (everything), summary.json (without the curves, what
the docs cite), predictions.jsonl (per query, softknn beside the baseline) and the plots."""

from __future__ import annotations

import json
from pathlib import Path

from softknn.evaluation.plots import plot_abstain, plot_evidence, plot_retrieval


def summary(rep: dict) -> dict:
    """The report without its curves (what the docs cite)."""
    out = json.loads(json.dumps(rep))
    out.get("classification", {}).pop("curves", None)
    out.get("evidence", {}).pop("curves", None)
    for row in out.get("retrieval", {}).values():
        row.pop("recall_curve", None)
    return out


def write_predictions(path: Path, run, base: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for q, o, b in zip(run.queries, run.outcomes[0], base, strict=True):
            f.write(json.dumps({"id": q.id, "label": q.label, "gold": q.gold,
                                "softknn": {k: o[k] for k in ("prediction", "score", "ranked", "label_scores", "memory_share")},
                                "baseline": {k: b[k] for k in ("nn1", "prediction", "score", "ranked")}},
                               ensure_ascii=False) + "\n")


def write_report(out: Path, rep: dict, run, base: list[dict], *, title: str = "") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2))
    (out / "summary.json").write_text(json.dumps(summary(rep), indent=2))
    write_predictions(out / "predictions.jsonl", run, base)
    plot_abstain(rep, out / "abstain.png", title)
    plot_evidence(rep, out / "evidence.png", title)
    plot_retrieval(rep, out / "retrieval.png", title)
    return rep
