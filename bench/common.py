"""Shared helpers of the benchmarks: machine facts, timing with repeats, percentiles, JSON + PNG output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def shared_data() -> Path:
    """The evaluation data folder `shared/data` beside the repository, or beside a folder above it (a git
    worktree under another folder)."""
    root = Path(__file__).resolve().parents[1]
    for up in root.parents:
        if (up / "shared" / "data").is_dir():
            return up / "shared" / "data"
    return root.parent / "shared" / "data"


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # the box is shared: read figures with it
    }


def speed_probe(mb: int = 256, repeats: int = 5) -> dict:
    """How fast this machine is right now, for reading a run's figures (the VM's speed drifts by 10-50% over
    minutes: its memory more than its cores): a copy of `mb` MB in numpy (GB/s moved, read and write, best
    of `repeats`) and a 512 x 512 float32 matrix product on the cores torch has (GFLOP/s, best of `repeats`)."""
    import numpy as np

    a = np.ones(mb * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    copy = min(_seconds(lambda: np.copyto(b, a)) for _ in range(repeats))
    m = np.ones((512, 512), np.float32)
    prod = min(_seconds(lambda: m @ m) for _ in range(repeats))
    return {"copy_gb_s": round(2 * a.nbytes / copy / 1e9, 1), "matmul_gflop_s": round(2 * 512**3 / prod / 1e9, 1)}


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed(fn, repeats: int = 3) -> dict:
    """Run fn `repeats` times; median and min–max of wall seconds (the machine is shared and noisy)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": times}


def timed_pair(fa, fb, repeats: int = 3) -> tuple[dict, dict]:
    """Time two alternatives interleaved (a, b, a, b, …) so drifting load hits both alike.

    Besides wall seconds, each side gets the process CPU seconds of its runs (`cpu_*`): on this
    shared box wall time includes time spent descheduled, CPU time does not (with one torch
    thread it is the work itself; with more it also counts threads spinning at barriers).
    """
    ta, tb, ca, cb = [], [], [], []
    for _ in range(repeats):
        for fn, acc, cacc in ((fa, ta, ca), (fb, tb, cb)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
            cacc.append(time.process_time() - c0)

    def summary(t, c):
        return {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs": t,
                "cpu_median_s": statistics.median(c), "cpu_min_s": min(c), "cpu_max_s": max(c)}

    return summary(ta, ca), summary(tb, cb)


def percentile(xs, q: float) -> float:
    """The q-th percentile (0..100) of xs, linear interpolation (numpy's default); nan when empty.
    The one percentile of the benchmarks (tests/harness.py's nearest-rank one is the harness's)."""
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def summary(xs, qs: tuple[float, ...] = (50, 90, 99), scale: float = 1.0, suffix: str = "") -> dict:
    """{p50, p90, p99 (the qs), mean, min, max, n} of xs, each value times `scale`, keys + `suffix`
    (summary(seconds, (50, 99), 1e3, "_ms") → p50_ms, p99_ms, mean_ms, …)."""
    import numpy as np

    a = np.asarray(xs, dtype=np.float64)
    out = {f"p{q:g}": percentile(a, q) for q in qs}
    out |= {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())} if len(a) else {}
    out = {k + suffix: v * scale for k, v in out.items()}
    return {**out, "n": len(a)}


def result_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def write(name: str, payload: dict) -> dict:
    """Write bench/results/NAME.json: the payload under the benchmark's name, the time and the machine;
    returns what it wrote (a benchmark's `run` returns it)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(), **payload}
    result_path(name).write_text(json.dumps(payload, indent=2))
    return payload


def plot_stacked(name: str, bars: list[tuple[str, dict[str, float]]], parts: list[str], ylabel: str, title: str,
                 totals: list[float] | None = None) -> Path:
    """bench/results/NAME.png: one stacked bar per (label, {part: value}), the parts in `parts`' order
    (a part a bar lacks counts 0); `totals` written above the bars where given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.15 * len(bars)), 4.2))
    for i, (_, values) in enumerate(bars):
        bottom = 0.0
        for j, part in enumerate(parts):
            ax.bar(i, values.get(part, 0.0), bottom=bottom, color=f"C{j}", label=part if i == 0 else None)
            bottom += values.get(part, 0.0)
        if totals is not None:
            ax.text(i, bottom, f"{totals[i]:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_bars(name: str, labels: list[str], values: list[float], errs: list[tuple[float, float]] | None, ylabel: str, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    yerr = None
    if errs:
        yerr = [[v - lo for v, (lo, _) in zip(values, errs)], [hi - v for v, (_, hi) in zip(values, errs)]]
    ax.bar(labels, values, yerr=yerr, capsize=4, color=["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"][: len(values)])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.3g}", ha="center", va="bottom")
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
