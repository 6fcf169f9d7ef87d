"""`softknn serve` vs `softknn serve --ray` (2 shard actors) over HTTP: p50/p95, dense and hybrid.

    python -m bench ray_http [--queries 40] [--warmup 5] [--bundle DIR] [--ingress proxy|haproxy]
                             [--ray-env KEY=VALUE ...] [--name ray_http]

Both servers serve the same sharded bundle: the sample KB built with `softknn build --shards 2`
(`--bundle`, default $SOFTKNN_BENCH_CACHE/sample2, built when missing). The single process opens
its 2 shards in-process (softknn.storage.shards.LocalShards), `--ray` as 2 Ray actors behind the Serve
proxy (`--ingress proxy`, the default) or Ray Serve's HAProxy ingress (`--ingress haproxy`) and one
model replica. Both run one torch thread and no API key (the harness's
tests/harness.py LiveServer). Each query (the sample KB's queries.jsonl, one input per
request) goes to both servers, alternating which first, in dense and in hybrid retrieval, one
request at a time: every figure sees the same load. The answers are compared (same evidence ids in
the same order, max |Δ| of similarities and embedding). `/healthz` is timed the same way: the proxy's own cost, no model,
no shard. Each side's p50/p95 is over `--queries` requests after `--warmup` warm-up requests.
`moved`: then, in this process with the shards as 2 Ray actors, over the same queries: Engine.infer
p50/p95 without the proxy, the shard fan-outs per request and the bytes of array data the shards
send (per request and per shard method), with the memory rows read from the shards' files here
(`local_reads`, what a replica on the shards' machine does) and through the actors (what one on
another machine does), each query both ways. Written to bench/results/NAME.json and NAME.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import percentile, write
from bench.kb import CACHE, set_threads
from tests.harness import LiveServer, free_port

REPO = Path(__file__).resolve().parents[1]
SIDES = ("single", "ray_2_shards")
MODES = ("dense", "hybrid")


def sharded_sample(path: Path) -> Path:
    """The sample KB as a bundle of 2 shards at `path` (`softknn build --shards 2` when missing)."""
    if not (path / "manifest.json").is_file():
        from softknn.common.console import sample_kb_path

        subprocess.run([sys.executable, "-m", "softknn", "build", str(sample_kb_path()), "--out", str(path),
                        "--shards", "2", "--force", "--no-progress"], check=True, cwd=REPO,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return path


def server(name: str, bundle: Path, ray: bool, env: dict[str, str] | None = None, ingress: str = "proxy") -> LiveServer:
    port = free_port()
    cmd = LiveServer.command(bundle, port, log_level="warning") + (["--ray", "--ingress", ingress] if ray else [])
    return LiveServer.spawn(cmd, Path(tempfile.gettempdir()) / f"bench_ray_http_{name}.log", port=port,
                            env={"HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1", **(env or {})})


def queries(n: int) -> list[str]:
    from softknn.common.console import sample_kb_path

    lines = (sample_kb_path().parent / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(x)["text"] for x in lines if x.strip()]
    return [texts[i % len(texts)] for i in range(n)]


def _nbytes(x) -> int:
    """The bytes of the arrays in a shard's answer (what crosses to the replica, less pickling)."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, list | tuple):
        return sum(_nbytes(y) for y in x)
    return 0


def moved(bundle: Path, qs: list[str]) -> dict:
    """Per request, in this process with the shards as 2 Ray actors (RayShards, as `--ray` has them,
    without the Serve proxy and HTTP): Engine.infer's wall time, the shard fan-outs (calls to every
    shard or some) and the bytes of array data the shards send, in all and per shard method."""
    import numpy as np
    import ray

    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder
    from softknn.storage.bundle import load_bundle
    from softknn.storage.ray_shards import RayShards

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    ways = ("local_reads", "through_the_actors")
    try:
        set_threads(1)  # as the servers' one torch thread
        enc = Encoder()
        engines, logs = {}, {}
        for w in ways:
            b = load_bundle(bundle, expected_fingerprint=enc.info.fingerprint,
                            shard_backend=RayShards.factory(num_cpus=1, local_reads=w == "local_reads"))
            engines[w], logs[w] = Engine(enc, b), []

            def counted_some(m, s, a, call_some=b.backend.call_some, log=logs[w]):  # RayShards.call goes through it
                out = call_some(m, s, a)
                log.append((m, _nbytes(out)))
                return out

            b.backend.call_some = counted_some  # type: ignore[method-assign]
        out: dict = {w: {} for w in ways}
        for mode in MODES:
            p = InferParams(retrieval=mode)
            ms: dict = {w: [] for w in ways}
            calls: dict = {w: [] for w in ways}
            nbytes: dict = {w: [] for w in ways}
            by_method: dict = {w: {} for w in ways}
            for w in ways:
                engines[w].infer([qs[0]], p)  # warm-up
            for i, q in enumerate(qs):
                for w in (ways if i % 2 else ways[::-1]):
                    logs[w].clear()
                    t = time.perf_counter()
                    engines[w].infer([q], p)
                    ms[w].append((time.perf_counter() - t) * 1e3)
                    calls[w].append(len(logs[w]))
                    nbytes[w].append(sum(n for _, n in logs[w]))
                    for m, n in logs[w]:
                        by_method[w].setdefault(m, []).append(n)
            for w in ways:
                out[w][mode] = {"infer_p50_ms": round(percentile(ms[w], 50), 2),
                                "infer_p95_ms": round(percentile(ms[w], 95), 2),
                                "fanouts_per_request": float(np.mean(calls[w])),
                                "bytes_per_request_p50": int(np.median(nbytes[w])),
                                "bytes_per_call_p50": {m: int(np.median(v)) for m, v in by_method[w].items()}}
        for e in engines.values():
            e.bundle.close()
        return out
    finally:
        ray.shutdown()


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--queries", type=int, default=40, help="timed requests per side and mode")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bundle", type=Path, default=None, help="a 2-shard bundle (default: the sample KB's, built)")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy", help="the --ray server's ingress")
    ap.add_argument("--ray-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the --ray server (and so of its Ray processes); repeatable")
    ap.add_argument("--name", default="ray_http", help="results: bench/results/NAME.json and NAME.png")


def _timed(c, method: str, path: str, body: dict | None) -> tuple[float, dict | None]:
    t = time.perf_counter()
    r = c.post(path, json=body) if method == "POST" else c.get(path)
    dt = time.perf_counter() - t
    r.raise_for_status()
    return dt, (r.json() if method == "POST" else None)


def run(args: argparse.Namespace) -> dict:
    bundle = sharded_sample(args.bundle or CACHE / "sample2")
    ray_env = dict(kv.split("=", 1) for kv in args.ray_env)
    srv = {"single": server("single", bundle, False),
           "ray_2_shards": server("ray", bundle, True, ray_env, ingress=args.ingress)}
    lat: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIDES} for m in (*MODES, "healthz")}
    same, delta = {m: True for m in MODES}, {m: 0.0 for m in MODES}
    try:
        for s in SIDES:
            srv[s].wait_ready(args.ready_timeout, interval=1.0)
        qs = queries(args.queries + args.warmup)
        for i, q in enumerate(qs):
            order = SIDES if i % 2 else SIDES[::-1]
            for mode in MODES:
                body = {"inputs": [q], "retrieval": mode}
                got = {}
                for s in order:
                    dt, got[s] = _timed(srv[s].client, "POST", "/v1/infer", body)
                    if i >= args.warmup:
                        lat[mode][s].append(dt)
                a, b = (got[s]["results"][0]["evidence"] for s in SIDES)
                same[mode] &= [e["chunk_id"] for e in a] == [e["chunk_id"] for e in b]
                delta[mode] = max([delta[mode], *(abs(x["similarity"] - y["similarity"]) for x, y in zip(a, b, strict=False)),
                                   float(max(abs(x - y) for x, y in zip(*(got[s]["results"][0]["embedding"] for s in SIDES),
                                                                       strict=True)))])
            for s in order:
                dt, _ = _timed(srv[s].client, "GET", "/healthz", None)
                if i >= args.warmup:
                    lat["healthz"][s].append(dt)
    finally:
        for s in SIDES:
            srv[s].close()
    figures: dict = {}
    for mode, per in lat.items():
        p = {s: {"p50_ms": round(percentile(v, 50) * 1e3, 2), "p95_ms": round(percentile(v, 95) * 1e3, 2)}
             for s, v in per.items()}
        figures[mode] = {**p, "ratio_p50": round(p["ray_2_shards"]["p50_ms"] / p["single"]["p50_ms"], 3),
                         "ratio_p95": round(p["ray_2_shards"]["p95_ms"] / p["single"]["p95_ms"], 3)}
        if mode in MODES:
            figures[mode] |= {"same_evidence_ids_and_order": bool(same[mode]), "max_abs_delta_score": delta[mode]}
    figures["moved"] = moved(bundle, qs[args.warmup:])
    out = write(args.name, {"command": args.command, "bundle": str(bundle), "queries": args.queries,
                            "ingress": args.ingress, "ray_env": ray_env,
                             "warmup": args.warmup, "figures": figures,
                             "latencies_ms": {m: {s: [round(x * 1e3, 3) for x in v] for s, v in per.items()}
                                              for m, per in lat.items()}})
    plot(lat, figures, args.name)
    print(json.dumps({"command": args.command, "figures": figures}, indent=2))
    return out


def plot(lat: dict, figures: dict, name: str = "ray_http") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from bench.common import RESULTS

    fig, axes = plt.subplots(1, len(lat), figsize=(3.2 * len(lat), 3.6), sharey=False)
    figures = {m: figures[m] for m in lat}
    for ax, (mode, per) in zip(axes, lat.items(), strict=True):
        ax.boxplot([np.asarray(per[s]) * 1e3 for s in SIDES], showfliers=False)
        ax.set_xticks([1, 2], ["single", "Ray, 2 shards"])
        ax.set_title(f"{mode}: p50 ×{figures[mode]['ratio_p50']}", fontsize=9)
        ax.set_ylabel("ms per request (HTTP)")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["ray_http", *sys.argv[1:]])
