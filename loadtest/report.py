"""Per-call records → the load test's summary: requests/s, p50/p95/p99, failures by type, and for
generation the time to first token and each user's decode rate.

`Recorder.record(...)` is called once per client call (by the locust User); `Recorder.summary()`
returns a JSON-able dict and `write(summary, out_dir)` writes summary.json, summary.csv (one row
per request name, plus "Aggregated") and failures.csv (unexpected failures and expected refusals,
by type). Latency percentiles are exact (linear interpolation over every recorded call), not
locust's rounded histogram.

Generation (a generation call that got its answer passes `gen=GenStats`): the summary's
`generation` holds the tokens generated and their rate over the run, and over the streamed answers
the time to first token (p50/p99) and the tokens/s each user read at, (n − 1) / (t_last − t_first)
per stream (p50, p10: the slow tenth, mean); summary.csv's rows of streamed calls carry
ttft_p50_ms, ttft_p99_ms and tokens_per_s_p50.
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
from typing import Protocol


class GenMeasure(Protocol):
    """What a generation call measured (loadtest.generation.GenStats)."""

    tokens: int
    ttft_ms: float | None
    tokens_per_s: float | None


CSV_FIELDS = ["name", "method", "requests", "failures", "requests_per_s", "p50_ms", "p95_ms", "p99_ms",
              "mean_ms", "max_ms", "streams", "ttft_p50_ms", "ttft_p99_ms", "tokens_per_s_p50"]


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
    gen_tokens: int = 0  # tokens of the generation answers received
    gen_calls: int = 0  # generation calls answered (not refused, not failed)
    ttft: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))  # ms, per stream
    rates: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))  # tokens/s, per stream
    started: float | None = None  # monotonic clock: test start
    stopped: float | None = None  # test stop, or the end of the last call recorded after it

    def record(self, name: str, method: str, ms: float, *, failure: tuple[str, str] | None = None,
               refusal: str | None = None, texts: int = 0, gen: GenMeasure | None = None) -> None:
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
            if gen is not None:
                self._record_gen((name, method), gen)

    def _record_gen(self, key: tuple[str, str], gen: GenMeasure) -> None:
        self.gen_calls += 1
        self.gen_tokens += gen.tokens
        if gen.ttft_ms is not None:
            self.ttft[key].append(gen.ttft_ms)
        if gen.tokens_per_s is not None:
            self.rates[key].append(gen.tokens_per_s)

    def _generation(self, rate) -> dict | None:
        if not self.gen_calls:
            return None
        ttft = sorted(x for xs in self.ttft.values() for x in xs)
        rates = sorted(x for xs in self.rates.values() for x in xs)
        return {"calls": self.gen_calls, "tokens": self.gen_tokens, "tokens_per_s": rate(self.gen_tokens),
                "streams": len(ttft),
                "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99),
                            "mean": sum(ttft) / len(ttft) if ttft else math.nan},
                "tokens_per_s_per_user": {"p50": percentile(rates, 50), "p10": percentile(rates, 10),
                                          "mean": sum(rates) / len(rates) if rates else math.nan}}

    def summary(self, meta: dict | None = None) -> dict:
        elapsed = (self.stopped or 0.0) - (self.started or 0.0)
        rate = (lambda n: n / elapsed) if elapsed > 0 else (lambda n: math.nan)
        rows = []
        for (name, method), xs in sorted(self.times.items()):
            n_fail = self.failures_by_name[(name, method)]
            rows.append({"name": name, "method": method, "requests": len(xs), "failures": n_fail,
                         "requests_per_s": rate(len(xs)), **_latency(xs)})
            if (name, method) in self.ttft:
                ttft, rates = sorted(self.ttft[(name, method)]), sorted(self.rates.get((name, method), []))
                rows[-1].update(streams=len(ttft), ttft_p50_ms=percentile(ttft, 50), ttft_p99_ms=percentile(ttft, 99),
                                tokens_per_s_p50=percentile(rates, 50))
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
            "generation": self._generation(rate),
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
    gen = summary.get("generation")
    if gen:
        lines += ["", f"{'streamed generation':<50} {'streams':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'tok/s p50':>10}",
                  *(f"{r['name'][:50]:<50} {r['streams']:>7} {r['ttft_p50_ms']:>9.0f} {r['ttft_p99_ms']:>9.0f} "
                    f"{r['tokens_per_s_p50']:>10.1f}" for r in summary["by_name"] if "streams" in r),
                  f"generation ({summary.get('generator')}): {gen['calls']} answers, {gen['tokens']} tokens, "
                  f"{gen['tokens_per_s']:.1f} tokens/s in all; {gen['streams']} streams: TTFT p50 "
                  f"{gen['ttft_ms']['p50']:.0f} ms, p99 {gen['ttft_ms']['p99']:.0f} ms; tokens/s per user p50 "
                  f"{gen['tokens_per_s_per_user']['p50']:.1f}, p10 {gen['tokens_per_s_per_user']['p10']:.1f}"]
    return "\n".join(lines)


# --- one run per user count (python -m loadtest.run --levels 1,4,16) -------------------------------
LEVEL_FIELDS = ["users", "requests", "unexpected_failures", "expected_refusals", "requests_per_s", "p50_ms",
                "p99_ms", "gen_answers", "gen_tokens_per_s", "streams", "ttft_p50_ms", "ttft_p99_ms",
                "tokens_per_s_per_user_p50", "tokens_per_s_per_user_p10"]


def level_row(summary: dict) -> dict:
    """One user count's line of the combined report, from its summary (as written: NaN is null)."""
    gen = summary.get("generation") or {}
    ttft, rate = gen.get("ttft_ms") or {}, gen.get("tokens_per_s_per_user") or {}
    lat = summary["latency_ms"]
    return {"users": summary.get("users"), "requests": summary["requests"],
            "unexpected_failures": summary["unexpected_failures"],
            "expected_refusals": sum(summary["expected_refusals_by_type"].values()),
            "requests_per_s": summary["requests_per_s"], "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"],
            "gen_answers": gen.get("calls", 0), "gen_tokens_per_s": gen.get("tokens_per_s"),
            "streams": gen.get("streams", 0), "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99"),
            "tokens_per_s_per_user_p50": rate.get("p50"), "tokens_per_s_per_user_p10": rate.get("p10")}


def write_levels(rows: list[dict], meta: dict, out_dir: Path) -> list[Path]:
    """levels.json ({**meta, "levels": rows}) and levels.csv (one row per user count) in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "levels.json", out_dir / "levels.csv"]
    _write_atomic(paths[0], json.dumps(_json_safe({**meta, "levels": rows}), indent=2, sort_keys=True) + "\n")
    _write_atomic(paths[1], _csv_text(rows, LEVEL_FIELDS))
    return paths


def levels_table(rows: list[dict]) -> str:
    """The combined report for the console: one line per user count."""
    def f(x, spec: str) -> str:
        return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

    head = (f"{'users':>5} {'calls':>6} {'fail':>5} {'refused':>7} {'req/s':>6} {'p50 ms':>7} {'streams':>7} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'tok/s/user p50':>14} {'p10':>6} {'gen tok/s':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['users']:>5} {r['requests']:>6} {r['unexpected_failures']:>5} {r['expected_refusals']:>7} "
                     f"{f(r['requests_per_s'], '.2f'):>6} {f(r['p50_ms'], '.0f'):>7} {r['streams']:>7} "
                     f"{f(r['ttft_p50_ms'], '.0f'):>9} {f(r['ttft_p99_ms'], '.0f'):>9} "
                     f"{f(r['tokens_per_s_per_user_p50'], '.1f'):>14} {f(r['tokens_per_s_per_user_p10'], '.1f'):>6} "
                     f"{f(r['gen_tokens_per_s'], '.1f'):>9}")
    return "\n".join(lines)
