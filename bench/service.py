"""The service side by side: softknn over HTTP vs in-process, a naive service, infinity-emb and txtai.

    python -m bench service [--clients 1,4,16,64] [--duration 8] [--sequential 60] [--peers /work/peers]

How it measures (the KB, the queries, what is timed and checked): docs/benchmarks.md, "Methods",
`service`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import RESULTS, summary, write
from bench.kb import set_threads
from tests.harness import HOST, LiveServer, free_port

REPO = Path(__file__).resolve().parents[1]


def spawn(name: str, cmd: list[str], ready_path: str, env: dict | None = None, cwd: Path = REPO) -> LiveServer:
    """Start a server through the one harness (tests/harness.py) on a free port ("{port}" in `cmd`),
    HF offline, `env` on top, its output in $TMPDIR/bench_service_NAME.log; not waited for yet."""
    port = free_port()
    return LiveServer.spawn([c.replace("{port}", str(port)) for c in cmd],
                            Path(tempfile.gettempdir()) / f"bench_service_{name}.log", port=port,
                            env={"HF_HUB_OFFLINE": "1", **(env or {})}, cwd=cwd, ready_path=ready_path)


def softknn_server(name: str, bundle: Path, env: dict | None = None) -> LiveServer:
    """`python -m softknn.service.cli` on `bundle`, no auth, torch threads as this process's environment says."""
    return spawn(name, LiveServer.command(bundle, "{port}", log_level="warning"), "/readyz", env)


def ready(srv: LiveServer) -> LiveServer:
    srv.wait_ready(600, interval=0.5)
    return srv


def start_servers(bundle: Path, peers: Path, model_dir: str, kb_texts: list[str],
                  only: set[str] | None = None, softknn_workers: int = 0,
                  runtime: str = "torch") -> tuple[dict, dict, list[str]]:
    """Start the servers (all, or those in `only`); returns ({name: LiveServer}, info, missing peers)."""
    from bench.kb import device

    want = lambda name: not only or name in only  # noqa: E731
    servers, missing = {}, []

    def softknn(name: str, env: dict | None = None) -> LiveServer:
        return softknn_server(name, bundle, env)

    if want("softknn"):
        servers["softknn"] = softknn("softknn")
    if want("softknn-wait2"):  # the same server with the old 2 ms fill wait (see docs/benchmarks.md)
        servers["softknn-wait2"] = softknn("softknn-wait2", {"SOFTKNN_BATCHING__MAX_WAIT_MS": "2"})
    if softknn_workers:  # N inference worker threads (each with the torch threads every server gets)
        servers[f"softknn-w{softknn_workers}"] = softknn(f"softknn-w{softknn_workers}",
                                                         {"SOFTKNN_BATCHING__WORKERS": str(softknn_workers)})
    if runtime != "torch":  # the same servers with model.runtime=onnx, beside the torch ones
        env = {"SOFTKNN_MODEL__RUNTIME": runtime}
        if want(f"softknn-{runtime}"):
            servers[f"softknn-{runtime}"] = softknn(f"softknn-{runtime}", env)
        if softknn_workers:
            name = f"softknn-{runtime}-w{softknn_workers}"
            servers[name] = softknn(name, env | {"SOFTKNN_BATCHING__WORKERS": str(softknn_workers)})
    if want("naive"):
        servers["naive"] = spawn("naive", [sys.executable, "-m", "bench.naive_service", "--bundle", str(bundle), "--port",
                                            "{port}"], "/healthz")
    inf = peers / "infinity" / "bin" / "infinity_emb"
    if want("infinity") and inf.is_file():
        servers["infinity"] = spawn("infinity", [str(inf), "v2", "--model-id", model_dir, "--engine", "torch", "--device",
                                                  device(), "--host", HOST, "--port", "{port}"], "/models",
                                     env={"DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"})
    elif want("infinity"):
        missing.append(f"infinity ({inf} not found)")
    txt = peers / "txtai" / "bin" / "uvicorn"
    if want("txtai") and txt.is_file():
        cfg = Path(tempfile.mkdtemp(prefix="txtai-")) / "config.yml"
        cfg.write_text(f"writable: true\nembeddings:\n  path: {model_dir}\n  content: true\n")
        servers["txtai"] = spawn("txtai", [str(txt), "txtai.api:app", "--host", HOST, "--port", "{port}"], "/count",
                                  env={"CONFIG": str(cfg)}, cwd=cfg.parent)
    elif want("txtai"):
        missing.append(f"txtai ({txt} not found)")
    for s in servers.values():
        ready(s)
    info = {}
    if "txtai" in servers:
        t0 = time.perf_counter()
        url = servers["txtai"].url
        for i in range(0, len(kb_texts), 1000):
            docs = [{"id": str(j), "text": t} for j, t in enumerate(kb_texts[i:i + 1000], start=i)]
            httpx.post(f"{url}/add", json=docs, timeout=600).raise_for_status()
        httpx.get(f"{url}/index", timeout=1800).raise_for_status()
        info["txtai_index_s"] = time.perf_counter() - t0
        info["txtai_count"] = int(httpx.get(f"{url}/count").text)
    if "infinity" in servers:
        info["infinity_model"] = httpx.get(servers["infinity"].url + "/models").json()["data"][0]["id"]
    return servers, info, missing


def request_for(name: str, info: dict):
    """(method, path, kwargs(q)) for one short-input request to `name`."""
    if name.startswith("softknn"):
        return "POST", "/v1/infer", lambda q: {"json": {"inputs": [q], "k": 8, "evidence": 5}}
    if name == "naive":
        return "POST", "/search", lambda q: {"json": {"inputs": [q], "k": 8}}
    if name == "infinity":
        return "POST", "/embeddings", lambda q: {"json": {"model": info["infinity_model"], "input": [q]}}
    return "GET", "/search", lambda q: {"params": {"query": q, "limit": 8}}


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` and all its descendants (threads included), from /proc."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            procs[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]))  # ppid, utime + stime (ticks)
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, (pp, _) in procs.items() if pp == p and c not in tree]
    return sum(procs[p][1] for p in tree if p in procs) / os.sysconf("SC_CLK_TCK")


def lat_summary(t: list[float]) -> dict:
    """{p50_ms, p99_ms, mean_ms, min_ms, max_ms, n} of durations in seconds."""
    return summary(t, (50, 99), 1e3, "_ms")


def sequential(servers: dict, info: dict, engine, queries: list[str], n: int) -> dict:
    """One request at a time; per query every alternative once, in turn (load drift hits all alike)."""
    from bench.fused_forward import plain_forward
    from softknn.infer.engine import InferParams

    p = InferParams(k=8, evidence=5)
    clients = {name: httpx.Client(base_url=s.url, timeout=60) for name, s in servers.items()}
    reqs = {name: request_for(name, info) for name in servers}
    times: dict[str, list[float]] = {name: [] for name in ["in_process_fused", "in_process_plain", *servers]}
    for i in range(n + 5):
        q = queries[i % len(queries)]
        for name in times:
            t0 = time.perf_counter()
            if name == "in_process_fused":
                engine.infer([q], p)
            elif name == "in_process_plain":
                plain_forward(engine.encoder, q)
            else:
                method, path, kw = reqs[name]
                clients[name].request(method, path, **kw(q)).raise_for_status()
            if i >= 5:  # the first five are warm-up
                times[name].append(time.perf_counter() - t0)
    for c in clients.values():
        c.close()
    return {name: lat_summary(t) for name, t in times.items()}


async def load(url: str, method: str, path: str, kw, queries: list[str], clients: int, duration: float) -> dict:
    """`clients` tasks sending back to back until `duration` s have passed (in-flight ones finish)."""
    lat, errors = [], 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        start = time.perf_counter()
        stop = start + duration

        async def one(i: int) -> None:
            nonlocal errors
            n = i
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    r = await http.request(method, path, **kw(queries[n % len(queries)]))
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
                n += clients

        await asyncio.gather(*(one(i) for i in range(clients)))
        wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(lat), "errors": errors, "wall_s": wall, "req_per_s": len(lat) / wall,
            **(lat_summary(lat) if lat else {})}


def batches_run(url: str) -> int:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("softknn_batch_size_count "):
            return int(float(line.split()[1]))
    return 0


def plot(name: str, seq: dict, levels: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.5))
    names = list(seq)
    v = [seq[n]["p50_ms"] for n in names]
    a.bar(names, v, yerr=[[0] * len(v), [seq[n]["p99_ms"] - seq[n]["p50_ms"] for n in names]], capsize=3,
          color="#4C72B0")
    for i, x in enumerate(v):
        a.text(i, x, f"{x:.1f}", ha="center", va="bottom", fontsize=8)
    a.set_ylabel("ms, one request at a time (p50; bar to p99)")
    a.set_title("Latency of one short input")
    a.tick_params(axis="x", labelsize=7, rotation=20)
    for srv in sorted({lv["server"] for lv in levels}):
        rs = [lv for lv in levels if lv["server"] == srv]
        b.plot([r["clients"] for r in rs], [r["req_per_s"] for r in rs], "o-", label=srv)
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent clients")
    b.set_ylabel("requests / s")
    b.set_title("Throughput (load client on the same cores)")
    b.legend()
    for srv in sorted({lv["server"] for lv in levels}):
        rs = [lv for lv in levels if lv["server"] == srv and lv.get("requests_per_server_cpu_s")]
        c.plot([r["clients"] for r in rs], [r["requests_per_server_cpu_s"] for r in rs], "o-", label=srv)
    c.set_xscale("log", base=2)
    c.set_xlabel("concurrent clients")
    c.set_ylabel("requests per second of server CPU")
    c.set_title("Efficiency (robust to the shared box)")
    c.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


# --- --fill-wait: the batcher's fill wait, 2 ms against 0 ------------------------------------------
def server_metrics(c: httpx.Client) -> dict[str, float]:
    """The unlabelled softknn_* _sum and _count samples of /metrics."""
    out = {}
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("softknn_") and "{" not in line and line.split()[0].endswith(("_sum", "_count")):
            k, v = line.split()
            out[k] = float(v)
    return out


def fill_wait_probe(bundle: Path, queries: list[str], wait_ms: str, n: int) -> dict:
    srv = ready(softknn_server(f"wait{wait_ms}", bundle, {"SOFTKNN_BATCHING__MAX_WAIT_MS": wait_ms}))
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            body = lambda q: {"inputs": [q], "k": 8, "evidence": 5}  # noqa: E731
            for q in queries[:10]:
                c.post("/v1/infer", json=body(q)).raise_for_status()
            m0, lat = server_metrics(c), []
            for q in queries[10 : 10 + n]:
                t0 = time.perf_counter()
                c.post("/v1/infer", json=body(q)).raise_for_status()
                lat.append(time.perf_counter() - t0)
            m1 = server_metrics(c)
    finally:
        srv.close()
    d = {k: m1[k] - m0.get(k, 0.0) for k in m1}
    mean = lambda name: 1e3 * d[f"{name}_sum"] / d[f"{name}_count"]  # noqa: E731
    return {"max_wait_ms": float(wait_ms), "client_p50_ms": statistics.median(lat) * 1e3,
            "queue_wait_ms": mean("softknn_queue_wait_seconds"), "inference_ms": mean("softknn_inference_seconds")}


def fill_wait(args) -> dict:
    from bench.kb import SHARED, bundle_path

    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        queries = [r["text"] for r in csv.DictReader(f)][:200]
    rows = []
    for _ in range(args.rounds):
        for wait in ("2", "0"):
            rows.append(fill_wait_probe(bundle_path(10_000), queries, wait, args.requests))
            print(json.dumps({k: round(v, 2) for k, v in rows[-1].items()}), flush=True)
    return write("service_wait", {"command": f"python -m bench service --fill-wait --rounds {args.rounds} "
                                      f"--requests {args.requests} --threads {args.threads}", "rows": rows})


# --- --quick: softknn alone on the sample bundle ---------------------------------------------------
def quick(args) -> dict:
    from softknn.common.console import sample_kb_path
    from tests.harness import ensure_bundle

    bundle = ensure_bundle(args.bundle)
    queries = [json.loads(line)["text"] for line in (sample_kb_path().parent / "queries.jsonl").read_text().splitlines()
               if line.strip()]
    runs = []
    for threads in [int(t) for t in args.quick_threads.split(",")]:
        srv = ready(softknn_server(f"quick{threads}", bundle,
                                   {"SOFTKNN_MODEL__THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}))
        try:
            for q in queries[:10]:  # warm-up
                httpx.post(f"{srv.url}/v1/infer", json={"inputs": [q]}, timeout=60).raise_for_status()
            levels = []
            for c in [int(x) for x in args.clients.split(",")]:
                before = batches_run(srv.url)
                r = asyncio.run(load(srv.url, "POST", "/v1/infer", lambda q: {"json": {"inputs": [q]}}, queries, c,
                                     args.duration))
                nb = batches_run(srv.url) - before
                r["mean_batch_size"] = r["requests"] / nb if nb else None
                levels.append({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
            runs.append({"torch_threads": threads, "levels": levels})
        finally:
            srv.close()
    out = {"benchmark": "service --quick", "command": args.command,
           "request": {"inputs": 1, "params": "defaults (k 8, alpha 0.7, fixed, 5 evidence)"},
           "duration_s_per_level": args.duration, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
           "runs": runs}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--sequential", type=int, default=60, help="queries in the one-at-a-time phase")
    ap.add_argument("--peers", type=Path, default=Path("/work/peers"))
    ap.add_argument("--only", default="", help="comma-separated servers to run (default all)")
    ap.add_argument("--name", default="service")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")
    ap.add_argument("--softknn-workers", type=int, default=0,
                    help="also run softknn as `softknn-wN` with SOFTKNN_BATCHING__WORKERS=N inference threads (0 = not)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="softknn alone on the sample bundle (see above)")
    mode.add_argument("--fill-wait", action="store_true", help="the batcher's fill wait, 2 ms against 0 (see above)")
    ap.add_argument("--quick-threads", default="1", help="--quick: torch thread counts to compare, e.g. 1,2")
    ap.add_argument("--bundle", type=Path, default=Path("/tmp/svc_bundle"), help="--quick: bundle (built from the "
                    "sample KB if missing)")
    ap.add_argument("--out", type=Path, help="--quick: also write the JSON here")
    ap.add_argument("--rounds", type=int, default=2, help="--fill-wait: rounds of (2 ms, 0)")
    ap.add_argument("--requests", type=int, default=120, help="--fill-wait: sequential requests per server")
    ap.add_argument("--runtime", default="torch", choices=["torch", "onnx"],
                    help="onnx: also run softknn (and softknn-wN) with SOFTKNN_MODEL__RUNTIME=onnx, as softknn-onnx[-wN]")


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.clients = args.clients if args.clients != "1,4,16,64" else "1,4,16"
        args.duration = args.duration if args.duration != 8.0 else 10.0
        return quick(args)
    set_threads(args.threads)
    if args.threads:  # the same for every server started below
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                          SOFTKNN_MODEL__THREADS=str(args.threads))
    if args.fill_wait:
        return fill_wait(args)

    from bench.kb import SHARED, bundle_path, device
    from softknn.infer.engine import Engine
    from softknn.model.encoder import Encoder, resolve_model_path
    from softknn.storage.bundle import load_bundle

    bundle = bundle_path(10_000)
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        queries = [r["text"] for r in csv.DictReader(f)][:500]
    kb_texts = [json.loads(line)["text"] for line in (bundle.parent / "kb-10000.jsonl").read_text().splitlines()]
    engine = Engine(Encoder(device=device()), load_bundle(bundle, use_gpu=device() == "cuda"))
    only = set(args.only.split(",")) if args.only else None
    servers, info, missing = start_servers(bundle, args.peers, resolve_model_path(None), kb_texts, only,
                                           softknn_workers=args.softknn_workers, runtime=args.runtime)
    try:
        seq = sequential(servers, info, engine, queries, args.sequential)
        print(json.dumps({n: round(s["p50_ms"], 2) for n, s in seq.items()}), flush=True)
        levels = []
        for c in [int(x) for x in args.clients.split(",")]:
            for name, s in servers.items():
                method, path, kw = request_for(name, info)
                before = batches_run(s.url) if name.startswith("softknn") else 0
                cpu0 = tree_cpu_s(s.proc.pid)
                r = asyncio.run(load(s.url, method, path, kw, queries, c, args.duration))
                cpu = tree_cpu_s(s.proc.pid) - cpu0
                # robust to the shared box: CPU the server spent per answered request, and the
                # requests/s that makes per core it gets (a multi-threaded server also gets more
                # of a contended box's CPU, which raw requests/s rewards)
                r["server_cpu_s"] = cpu
                r["server_cpu_ms_per_request"] = 1e3 * cpu / max(1, r["requests"])
                r["requests_per_server_cpu_s"] = r["requests"] / cpu if cpu > 0 else None
                if name.startswith("softknn"):
                    nb = batches_run(s.url) - before
                    r["mean_batch_size"] = r["requests"] / nb if nb else None
                r["server"] = name
                levels.append(r)
                print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    finally:
        for s in servers.values():
            s.close()
    by = {(lv["server"], lv["clients"]): lv for lv in levels}
    ratios = {"in_process_fused_over_plain_p50": seq["in_process_fused"]["p50_ms"] / seq["in_process_plain"]["p50_ms"]}
    for sk in [n for n in servers if n.startswith("softknn")]:
        ratios[f"{sk}_p50_over_in_process_fused_p50"] = seq[sk]["p50_ms"] / seq["in_process_fused"]["p50_ms"]
        for peer in ("naive", "infinity", "txtai"):
            if (peer, 16) in by and (sk, 16) in by:
                ratios[f"{sk}_rps_over_{peer}_rps_at_16"] = by[(sk, 16)]["req_per_s"] / by[(peer, 16)]["req_per_s"]
                a, b = by[(sk, 16)]["requests_per_server_cpu_s"], by[(peer, 16)]["requests_per_server_cpu_s"]
                if a and b:
                    ratios[f"{sk}_rps_per_cpu_over_{peer}_at_16"] = a / b
    cmd = (f"python -m bench service --clients {args.clients} --duration {args.duration} --sequential {args.sequential} "
           f"--threads {args.threads} --name {args.name}" + (f" --only {args.only}" if args.only else "")
           + (f" --softknn-workers {args.softknn_workers}" if args.softknn_workers else "")
           + (f" --runtime {args.runtime}" if args.runtime != "torch" else ""))
    written = write(args.name, {"command": cmd, "kb_chunks": len(kb_texts), "missing_peers": missing, "info": info,
                      "loadavg_at_end": os.getloadavg(), "sequential": seq, "load": levels, "ratios": ratios})
    plot(args.name, seq, levels)
    print(json.dumps(ratios, indent=2))
    return written


if __name__ == "__main__":  # python -m bench service: the same as python -m bench service
    import sys

    from bench.__main__ import main

    main(["service", *sys.argv[1:]])
