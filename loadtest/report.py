"""Per-call records → the load test's summary: requests/s, p50/p95/p99, failures by type.

`Recorder.record(...)` is called once per client call (by the locust User); `Recorder.summary()`
returns a JSON-able dict and `write(summary, out_dir)` writes summary.json, summary.csv (one row
per request name, plus "Aggregated") and failures.csv (unexpected failures and expected refusals,
by type). Latency percentiles are exact (linear interpolation over every recorded call), not
locust's rounded histogram.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CSV_FIELDS = ["name", "method", "requests", "failures", "requests_per_s", "p50_ms", "p95_ms", "p99_ms",
              "mean_ms", "max_ms"]


def percentile(sorted_xs: list[float], q: float) -> float:
    """q-th percentile (0..100) of sorted values, linear interpolation (numpy's default); nan if empty."""
    if not sorted_xs:
        return math.nan
    pos = (len(sorted_xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def _latency(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"p50_ms": percentile(s, 50), "p95_ms": percentile(s, 95), "p99_ms": percentile(s, 99),
            "mean_ms": sum(s) / len(s) if s else math.nan, "max_ms": s[-1] if s else math.nan}


@dataclass
class Recorder:
    """Collects one record per call; single process (locust's greenlets share it)."""

    times: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    failures: Counter = field(default_factory=Counter)  # unexpected outcomes by type
    failures_by_name: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # expected 4xx by "<status> <error type>"
    examples: dict[str, str] = field(default_factory=dict)  # first message of each failure type
    texts_ok: int = 0  # inputs of successful /v1/infer calls
    started: float | None = None  # monotonic clock: test start
    stopped: float | None = None  # test stop, or the end of the last call recorded after it

    def record(self, name: str, method: str, ms: float, *, failure: tuple[str, str] | None = None,
               refusal: str | None = None, texts: int = 0) -> None:
        self.times[(name, method)].append(ms)
        if self.stopped is not None:  # a call that was in flight at the stop (locust's --stop-timeout)
            self.stopped = max(self.stopped, time.monotonic())
        if failure is not None:
            kind, message = failure
            self.failures[kind] += 1
            self.failures_by_name[(name, method)] += 1
            self.examples.setdefault(kind, message[:500])
        elif refusal is not None:
            self.refusals[refusal] += 1
        else:
            self.texts_ok += texts

    def summary(self, meta: dict | None = None) -> dict:
        elapsed = (self.stopped or 0.0) - (self.started or 0.0)
        rate = (lambda n: n / elapsed) if elapsed > 0 else (lambda n: math.nan)
        rows = []
        for (name, method), xs in sorted(self.times.items()):
            n_fail = self.failures_by_name[(name, method)]
            rows.append({"name": name, "method": method, "requests": len(xs), "failures": n_fail,
                         "requests_per_s": rate(len(xs)), **_latency(xs)})
        every = [x for xs in self.times.values() for x in xs]
        total, failed = len(every), sum(self.failures.values())
        return {
            **(meta or {}),
            "elapsed_s": elapsed,
            "requests": total,
            "requests_per_s": rate(total),
            "infer_texts_per_s": rate(self.texts_ok),
            "latency_ms": _latency(every),
            "unexpected_failures": failed,
            "failure_rate": failed / total if total else math.nan,
            "failures_by_type": dict(sorted(self.failures.items())),
            "failure_examples": dict(sorted(self.examples.items())),
            "expected_refusals_by_type": dict(sorted(self.refusals.items())),
            "by_name": rows,
            "ok": total > 0 and failed == 0,
        }


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _csv_text(rows: list[dict], fields: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in row.items() if k in fields})
    return buf.getvalue()


def write(summary: dict, out_dir: Path) -> list[Path]:
    """summary.json, summary.csv and failures.csv in out_dir (created); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    agg = {"name": "Aggregated", "method": "", "requests": summary["requests"],
           "failures": summary["unexpected_failures"], "requests_per_s": summary["requests_per_s"],
           **summary["latency_ms"]}
    fail_rows = [{"kind": "unexpected", "type": k, "count": n} for k, n in summary["failures_by_type"].items()]
    fail_rows += [{"kind": "expected", "type": k, "count": n} for k, n in summary["expected_refusals_by_type"].items()]
    paths = [out_dir / "summary.json", out_dir / "summary.csv", out_dir / "failures.csv"]
    _write_atomic(paths[0], json.dumps(_json_safe(summary), indent=2, sort_keys=True) + "\n")
    _write_atomic(paths[1], _csv_text([*summary["by_name"], agg], CSV_FIELDS))
    _write_atomic(paths[2], _csv_text(fail_rows, ["kind", "type", "count"]))
    return paths


def table(summary: dict) -> str:
    """A plain-text table of the summary, for the console."""
    head = f"{'name':<50} {'reqs':>6} {'fail':>5} {'req/s':>7} {'p50':>8} {'p95':>8} {'p99':>8}  (ms)"
    lines = [head, "-" * len(head)]
    agg = {"name": "Aggregated", "requests": summary["requests"], "failures": summary["unexpected_failures"],
           "requests_per_s": summary["requests_per_s"], **summary["latency_ms"]}
    for r in [*summary["by_name"], agg]:
        lines.append(f"{r['name'][:50]:<50} {r['requests']:>6} {r['failures']:>5} {r['requests_per_s']:>7.2f} "
                     f"{r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} {r['p99_ms']:>8.1f}")
    lines.append(f"infer texts/s {summary['infer_texts_per_s']:.2f}; expected refusals "
                 f"{sum(summary['expected_refusals_by_type'].values())} "
                 f"{dict(summary['expected_refusals_by_type'])}; unexpected failures "
                 f"{summary['unexpected_failures']} {dict(summary['failures_by_type'])}")
    return "\n".join(lines)
