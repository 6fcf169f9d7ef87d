"""One short input under contention: the service's p50 against a plain in-process encode, idle and beside a CPU hog, for the old and the new defaults.

    python -m bench contention [--hogs 4] [--rounds 4] [--block 15] [--name contention]

Servers (each `python -m softknn.service.cli` on the sample bundle, started once, through the harness):
- `old`: the defaults before this benchmark: torch, model.threads = the CPU cores (what 0 meant),
  libgomp's own wait policy (GOMP_SPINCOUNT=300000, its default when OMP_WAIT_POLICY is unset; that
  keeps `softknn serve` from setting PASSIVE, its default now);
- `old-passive`: the same with OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning);
- `torch-1t`: torch with one thread per worker (the new threading, the old runtime);
- `new`: the defaults as they are now (no SOFTKNN_MODEL__* set: runtime auto, one thread per worker);
- `new-cores`: the new defaults with model.threads = the cores (ONNX Runtime's pool, not spinning).

The baseline is a plain encode in this process (`SentenceTransformer.encode([text])`, the
unmodified model and nothing else), with torch's default threads (the cores) and with one; the
ratio is each server's p50 over the *faster* of the two plain p50s in the same condition. Each
request is one short Banking77-style question, `POST /v1/infer` with the defaults (k 8, hybrid
retrieval, 5 evidence items), one at a time over a kept-alive connection.

Conditions: `idle` (nothing of ours beside), then `hog` (`--hogs` processes each spinning a busy
loop, started before and stopped after). Within a condition the variants take turns in blocks of
`--block` requests for `--rounds` rounds, so drifting load (the box is shared) hits each alike; the
1-minute load average is recorded at every block. JSON and PNG under bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.common import RESULTS, summary, write

QUERIES = [
    "How do I reset my PIN?", "My card has not arrived yet", "Why was my top-up declined?",
    "Can I get a refund?", "Is there a fee for exchanging currency?", "I lost my card",
    "How long does a transfer take?", "What is my card limit?",
]

SERVERS = {  # name -> environment on top of this process's (SOFTKNN_MODEL__THREADS unset = the default)
    "old": lambda cores: {"SOFTKNN_MODEL__RUNTIME": "torch", "SOFTKNN_MODEL__THREADS": str(cores),
                          "GOMP_SPINCOUNT": "300000"},
    "old-passive": lambda cores: {"SOFTKNN_MODEL__RUNTIME": "torch", "SOFTKNN_MODEL__THREADS": str(cores),
                                  "OMP_WAIT_POLICY": "PASSIVE"},
    "torch-1t": lambda cores: {"SOFTKNN_MODEL__RUNTIME": "torch"},
    "new": lambda cores: {},
    "new-cores": lambda cores: {"SOFTKNN_MODEL__THREADS": str(cores)},
}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hogs", type=int, default=0, help="busy-loop processes in the hog condition (0 = 2 × cores)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of blocks per condition")
    ap.add_argument("--block", type=int, default=15, help="requests per variant per round")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated servers to run")
    ap.add_argument("--bundle", default="/tmp/svc_bundle", help="bundle (built from the sample KB if missing)")
    ap.add_argument("--name", default="contention")


def _hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(10)


def run(args: argparse.Namespace) -> dict:
    from pathlib import Path

    import httpx
    import torch
    from sentence_transformers import SentenceTransformer

    from bench.service import ready, softknn_server
    from softknn.model.encoder import resolve_model_path
    from tests.harness import ensure_bundle

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for k in [k for k in os.environ if k.startswith("SOFTKNN_") or k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")]:
        del os.environ[k]  # every server gets exactly its variant's environment on top of a clean one
    cores = os.cpu_count() or 1
    default_threads = torch.get_num_threads()
    bundle = ensure_bundle(Path(args.bundle))
    st = SentenceTransformer(resolve_model_path(None), device="cpu", local_files_only=True)
    names = [n for n in args.servers.split(",") if n]
    servers = {n: softknn_server(f"contention_{n}", bundle, SERVERS[n](cores)) for n in names}
    hogs: list[subprocess.Popen] = []
    conditions = {}
    try:
        for s in servers.values():
            ready(s)
        runtimes = {n: s.client.get("/v1/index").json()["runtime"] for n, s in servers.items()}
        clients = {n: httpx.Client(base_url=s.url, timeout=120.0) for n, s in servers.items()}

        def plain(threads: int):
            def call(q: str) -> None:
                torch.set_num_threads(threads)
                st.encode([q], convert_to_numpy=True)
            return call

        def served(name: str):
            def call(q: str) -> None:
                clients[name].post("/v1/infer", json={"inputs": [q]}).raise_for_status()
            return call

        variants = {f"plain-{default_threads}t": plain(default_threads), "plain-1t": plain(1)}
        variants |= {f"service-{n}": served(n) for n in names}
        for fn in variants.values():  # warm-up
            for q in QUERIES[:3]:
                fn(q)
        for cond in ("idle", "hog"):
            if cond == "hog":
                hogs = _hogs(args.hogs or 2 * cores)
                time.sleep(3)  # let the scheduler see them
            lat: dict[str, list[float]] = {v: [] for v in variants}
            load = []
            i = 0
            for _ in range(args.rounds):
                for v, fn in variants.items():
                    load.append(round(os.getloadavg()[0], 2))
                    for _ in range(args.block):
                        q = QUERIES[i % len(QUERIES)]
                        i += 1
                        t0 = time.perf_counter()
                        fn(q)
                        lat[v].append(time.perf_counter() - t0)
            _stop(hogs)
            hogs = []
            stats = {v: summary(x, (50, 90), 1e3, "_ms") for v, x in lat.items()}
            base = min(stats[v]["p50_ms"] for v in variants if v.startswith("plain-"))
            conditions[cond] = {
                "hog_processes": (args.hogs or 2 * cores) if cond == "hog" else 0,
                "loadavg_1m_per_block": load, "loadavg_1m_median": statistics.median(load),
                "latency": stats, "plain_p50_ms": base,
                "p50_over_plain": {v: stats[v]["p50_ms"] / base for v in variants if v.startswith("service-")},
            }
            print(cond, {v: round(r, 2) for v, r in conditions[cond]["p50_over_plain"].items()},
                  "load", conditions[cond]["loadavg_1m_median"], flush=True)
        for c in clients.values():
            c.close()
    finally:
        _stop(hogs)
        for s in servers.values():
            s.close()
    cmd = args.command if hasattr(args, "command") else "python -m bench contention"
    out = write(args.name, {
        "command": cmd, "cores": cores, "bench_torch_default_threads": default_threads,
        "request": {"inputs": 1, "params": "defaults (k 8, hybrid, 5 evidence)", "queries": QUERIES},
        "servers": {n: {"env": SERVERS[n](cores), "runtime": runtimes[n]} for n in names},
        "rounds": args.rounds, "block": args.block, "conditions": conditions,
    })
    plot(args.name, conditions)
    return out


def plot(name: str, conditions: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = list(conditions)
    variants = list(conditions[conds[0]]["latency"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.8 / len(variants)
    for j, v in enumerate(variants):
        xs = [i + j * w for i in range(len(conds))]
        axes[0].bar(xs, [conditions[c]["latency"][v]["p50_ms"] for c in conds], w, label=v)
    axes[0].set_xticks([i + 0.4 - w / 2 for i in range(len(conds))],
                       [f"{c} (load {conditions[c]['loadavg_1m_median']})" for c in conds])
    axes[0].set_ylabel("p50 ms, one short input")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    served = [v for v in variants if v.startswith("service-")]
    w2 = 0.8 / max(1, len(served))
    for j, v in enumerate(served):
        xs = [i + j * w2 for i in range(len(conds))]
        axes[1].bar(xs, [conditions[c]["p50_over_plain"][v] for c in conds], w2, label=v)
    axes[1].axhline(1.6, color="k", ls="--", lw=1, label="1.6× target")
    axes[1].set_xticks([i + 0.4 - w2 / 2 for i in range(len(conds))], conds)
    axes[1].set_ylabel("service p50 / plain encode p50")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle("One short input: service vs plain in-process encode, idle and beside a CPU hog")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)
