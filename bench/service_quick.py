"""Quick service benchmark: latency of a one-input request and throughput at 1, 4 and 16 clients.

Starts a real server (`python -m service.cli`) on a free port against a bundle (the sample KB's,
built if missing), drives it with httpx over real HTTP, and prints JSON:

    python bench/service_quick.py                        # torch threads 1, the sample bundle
    python bench/service_quick.py --threads 1,2 --duration 15 --out bench/results/service_quick.json

Each request is POST /v1/infer with one sample query (the queries rotate) and the default
parameters (k 8, α 0.7, 5 evidence items). For c clients, c threads each send requests back to
back for --duration seconds; latency is measured per request at the client.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def sample_queries() -> list[str]:
    kb = Path(str(resources.files("softknn") / "sample_kb"))
    return [json.loads(line)["text"] for line in (kb / "queries.jsonl").read_text().splitlines() if line.strip()]


def ensure_bundle(path: Path) -> Path:
    """The sample KB's bundle at `path`, built with `softknn build` if it is not there."""
    if not (path / "manifest.json").is_file():
        from softknn.cli import sample_kb_path

        subprocess.run([sys.executable, "-c", "from softknn.cli import app; app()", "build", str(sample_kb_path()),
                        "--out", str(path), "--force", "--no-progress"], check=True, cwd=REPO,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bundle: Path, threads: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": str(threads)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "--bundle", str(bundle), "--port", str(port),
                                 "--log-level", "warning"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 300
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not get ready; see {log_path}")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def drive(url: str, clients: int, duration: float, queries: list[str]) -> dict:
    """c client threads, each sending one-input requests back to back for `duration` seconds."""
    lat: list[float] = []
    bad: list[int] = []
    lock = threading.Lock()
    start_at = time.monotonic() + 0.2
    stop_at = start_at + duration

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            n = i
            while time.monotonic() < start_at:
                time.sleep(0.001)
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                r = http.post("/v1/infer", json={"inputs": [queries[n % len(queries)]]})
                dt = time.perf_counter() - t0
                with lock:
                    (lat if r.status_code == 200 else bad).append(dt if r.status_code == 200 else r.status_code)
                n += clients

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start_at
    return {
        "clients": clients,
        "requests": len(lat),
        "errors": len(bad),
        "req_per_s": round(len(lat) / wall, 2),
        "p50_ms": round(percentile(lat, 50) * 1e3, 1),
        "p99_ms": round(percentile(lat, 99) * 1e3, 1),
        "mean_ms": round(statistics.fmean(lat) * 1e3, 1),
    }


def batches_run(url: str) -> int:
    """Micro-batches the server has run so far (from /metrics)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("softknn_batch_size_count "):
            return int(float(line.split()[1]))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=Path("/tmp/svc_bundle"),
                    help="bundle directory (built from the sample KB if missing)")
    ap.add_argument("--threads", default="1", help="torch intra-op threads to compare, e.g. 1,2")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per client level")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()

    bundle = ensure_bundle(args.bundle)
    queries = sample_queries()
    runs = []
    for threads in [int(t) for t in args.threads.split(",")]:
        log_path = Path(f"/tmp/service_quick_{threads}.log")
        proc, url = start_server(bundle, threads, log_path)
        try:
            for i in range(10):  # warm-up
                httpx.post(f"{url}/v1/infer", json={"inputs": [queries[i]]}, timeout=60)
            version = httpx.get(f"{url}/readyz").json()["bundle_version"]
            levels = []
            for c in [int(c) for c in args.clients.split(",")]:
                before = batches_run(url)
                res = drive(url, c, args.duration, queries)
                n = batches_run(url) - before
                res["mean_batch_size"] = round(res["requests"] / n, 2) if n else None
                levels.append(res)
            runs.append({"torch_threads": threads, "bundle_version": version, "levels": levels})
        finally:
            proc.terminate()
            proc.wait(30)
    out = {
        "benchmark": "service_quick",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "request": {"inputs": 1, "params": "defaults (k 8, alpha 0.7, fixed, 5 evidence)"},
        "duration_s_per_level": args.duration,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version()},
        "runs": runs,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
