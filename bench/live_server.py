"""A real softknn server process for the reliability scripts and tests (issue 7): start, probe, measure, stop.

    with LiveServer.start(bundle, log_path, env={...}) as srv:      # python -m service.cli on a free port
        srv.client.post("/v1/infer", json=...)                      # httpx.Client with the API key
        srv.rss()                                                   # resident memory of the process, bytes
        srv.metric("softknn_http_requests_total", status="200")  # a Prometheus counter, summed over labels

Every server binds 127.0.0.1 only, runs one torch thread (the 2-core box is shared; see
bench/service_quick.py) and has an API key and an admin token set, like a production deployment.
`module` runs another entry point with the same command line (tests/reliability/fault_server.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sk-reliability-4f1c9a7e2b6d"  # distinctive strings: the log tests search for them
ADMIN_TOKEN = "adm-reliability-8d3e6b0c51f9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile q ∈ [0, 100] of xs (nan when empty)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def latency_summary(seconds: list[float]) -> dict:
    """{n, p50_ms, p95_ms, p99_ms, max_ms} of a list of durations in seconds."""
    ms = lambda q: round(percentile(seconds, q) * 1e3, 2)  # noqa: E731
    return {"n": len(seconds), "p50_ms": ms(50), "p95_ms": ms(95), "p99_ms": ms(99), "max_ms": ms(100)}


def ensure_bundle(path: Path) -> Path:
    """The sample KB's bundle at `path`, built with `softknn build` when missing."""
    from bench.service_quick import ensure_bundle as build

    return build(Path(path))


@dataclass
class LiveServer:
    proc: subprocess.Popen
    url: str
    log_path: Path
    client: httpx.Client
    ready_statuses: list[int] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def start(cls, bundle: Path | None, log_path: Path, *, env: dict[str, str] | None = None,
              module: str = "service.cli", ready_timeout: float = 300.0) -> Iterator[LiveServer]:
        port = free_port()
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1",
                    "SOFTKNN_AUTH__API_KEY": API_KEY, "SOFTKNN_AUTH__ADMIN_TOKEN": ADMIN_TOKEN, **(env or {})}
        cmd = [sys.executable, "-m", module, "--port", str(port), "--log-level", "info"]
        if bundle is not None:
            cmd += ["--bundle", str(bundle)]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        client = httpx.Client(base_url=url, timeout=120.0, headers={"Authorization": f"Bearer {API_KEY}"})
        srv = cls(proc, url, log_path, client)
        try:
            srv.ready_statuses = srv.wait_ready(ready_timeout)
            yield srv
        finally:
            client.close()
            srv.stop()

    def wait_ready(self, timeout: float) -> list[int]:
        """Poll /readyz until 200; the statuses seen (0 = no connection yet)."""
        seen, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log:\n{self.log()[-4000:]}")
            try:
                r = self.client.get("/readyz", timeout=5)
                seen.append(r.status_code)
                if r.status_code == 200:
                    return seen
            except httpx.TransportError:
                seen.append(0)
            time.sleep(0.1)
        raise TimeoutError(f"not ready after {timeout} s; log:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server and wait for it; SIGKILL after `timeout`. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
        total = 0.0
        for family in text_string_to_metric_families(self.client.get("/metrics").text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def server_errors(self) -> float:
        """Requests this server answered with a 5xx, from its own /metrics."""
        total = 0.0
        for family in text_string_to_metric_families(self.client.get("/metrics").text):
            for s in family.samples:
                if s.name == "softknn_http_requests_total" and s.labels.get("status", "").startswith("5"):
                    total += s.value
        return total
