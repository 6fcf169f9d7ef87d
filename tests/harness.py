"""The one server harness of the tests and the benchmarks: start a real softknn server, wait for it,
measure it, stop it; and the hostile requests a server must refuse.

    srv = LiveServer.spawn(cmd, log_path, port=p, ready_path="/healthz")   # any HTTP server (bench/service.py's peers)
    srv.wait_ready(600); ...; srv.close()

    with LiveServer.start(bundle, log_path, env={...}) as srv:      # python -m softknn.service.cli on a free port
        srv.client.post("/v1/infer", json=...)                      # httpx.Client (API key set by default)
        srv.rss()                                                   # resident memory of the process, bytes
        srv.metric("softknn_http_requests_total", status="200")    # a Prometheus counter, summed over labels

    with threaded_server(create_app(settings, encoder=encoder)) as client:   # uvicorn in a thread of
        client.post("/v1/infer", json=...)                                  # this process (no model load)

Both serve real HTTP over real sockets on 127.0.0.1 through `softknn.service.server.uvicorn_config` (the
lingering close of `softknn serve`). A live server runs one torch thread (the 2-core box is shared)
and, unless `auth=False`, has an API key and an admin token set, like a production deployment;
`module` runs another entry point with the same command line (tests/reliability/fault_server.py).
Needs httpx (the `test` extra), as starlette.testclient does. It lives in tests/, out of the wheel;
the benchmarks import it as `tests.harness`, the shell scripts run `python -m tests.harness` from
the repository root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sk-reliability-4f1c9a7e2b6d"  # distinctive strings: the log tests search for them
ADMIN_TOKEN = "adm-reliability-8d3e6b0c51f9"
HOST = "127.0.0.1"


# --- ports and readiness ----------------------------------------------------------------------
def free_port() -> int:
    """A port nobody listens on now (bound and released; a server that can take a socket should get
    one from `bound_socket` instead, which holds the port)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free port of 127.0.0.1, for uvicorn's `sockets=`: no race for the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return sock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_ready(client: httpx.Client, timeout: float = 180.0, *, proc: subprocess.Popen | None = None,
               pid: int | None = None, log_path: Path | None = None, interval: float = 0.1,
               probe_timeout: float | None = None, path: str = "/readyz") -> list[int]:
    """Poll GET `path` (/readyz) until 200; the statuses seen (0 = no connection yet). Raises RuntimeError when
    `proc` (or the process `pid`, one this process did not start) exits first, TimeoutError after `timeout` s
    (with the tail of `log_path`). `probe_timeout`: each probe's own timeout (None: the client's; a
    TestClient takes none)."""
    tail = lambda: f"; log:\n{log_path.read_text(errors='replace')[-4000:]}" if log_path else ""  # noqa: E731
    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}{tail()}")
        if pid is not None and not _pid_alive(pid):
            raise RuntimeError(f"server (pid {pid}) exited{tail()}")
        try:
            r = client.get(path) if probe_timeout is None else client.get(path, timeout=probe_timeout)
            seen.append(r.status_code)
            if r.status_code == 200:
                return seen
        except httpx.TransportError:
            seen.append(0)
        time.sleep(interval)
    raise TimeoutError(f"not ready after {timeout} s; statuses seen {seen[-5:]}{tail()}")


# --- measuring --------------------------------------------------------------------------------


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
    path = Path(path)
    if not (path / "manifest.json").is_file():
        from softknn.common.console import sample_kb_path

        subprocess.run([sys.executable, "-m", "softknn", "build", str(sample_kb_path()), "--out", str(path),
                        "--force", "--no-progress"], check=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return path


# --- a server process -------------------------------------------------------------------------


@dataclass
class LiveServer:
    proc: subprocess.Popen
    url: str
    log_path: Path
    client: httpx.Client
    ready_statuses: list[int] = field(default_factory=list)
    ready_path: str = "/readyz"

    @staticmethod
    def command(bundle: Path | None, port: int, *, module: str = "softknn.service.cli", log_level: str = "info") -> list[str]:
        """`python -m <module> --port P --log-level L [--bundle B]`: a softknn server's command line."""
        cmd = [sys.executable, "-m", module, "--port", str(port), "--log-level", log_level]
        return cmd + ["--bundle", str(bundle)] if bundle is not None else cmd

    @classmethod
    def spawn(cls, cmd: list[str], log_path: Path, *, port: int, env: dict[str, str] | None = None,
              cwd: Path = REPO, ready_path: str = "/readyz", headers: dict[str, str] | None = None) -> LiveServer:
        """Start `cmd`, any HTTP server that listens on 127.0.0.1:`port` (bench/service.py's peers too),
        output to `log_path`, the environment with `env` on top; returns at once: `wait_ready`, then
        `close` (or `stop`). `start` is this with a softknn server's command, waited for and stopped."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://{HOST}:{port}"
        return cls(proc, url, log_path, httpx.Client(base_url=url, timeout=120.0, headers=headers), ready_path=ready_path)

    @classmethod
    @contextlib.contextmanager
    def start(cls, bundle: Path | None, log_path: Path, *, env: dict[str, str] | None = None,
              module: str = "softknn.service.cli", auth: bool = True, log_level: str = "info",
              ready_timeout: float = 300.0) -> Iterator[LiveServer]:
        """`python -m <module> --port P --log-level L [--bundle B]` on 127.0.0.1, one torch thread,
        HF offline, `env` on top; with `auth`, API_KEY and ADMIN_TOKEN set and the client sending the
        key. Yields once /readyz answers 200; SIGTERM (then SIGKILL after 30 s) on exit."""
        port = free_port()
        secrets = {"SOFTKNN_AUTH__API_KEY": API_KEY, "SOFTKNN_AUTH__ADMIN_TOKEN": ADMIN_TOKEN} if auth else {}
        srv = cls.spawn(cls.command(bundle, port, module=module, log_level=log_level), log_path, port=port,
                        env={"HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1", **secrets, **(env or {})},
                        headers={"Authorization": f"Bearer {API_KEY}"} if auth else None)
        try:
            srv.ready_statuses = srv.wait_ready(ready_timeout)
            yield srv
        finally:
            srv.close()

    def wait_ready(self, timeout: float, interval: float = 0.1) -> list[int]:
        """Poll `ready_path` (/readyz) until 200; the statuses seen (0 = no connection yet)."""
        return wait_ready(self.client, timeout, proc=self.proc, log_path=self.log_path, probe_timeout=5,
                          interval=interval, path=self.ready_path)

    def close(self) -> int:
        """Close the client and stop the server; its exit code."""
        self.client.close()
        return self.stop()

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


# --- a server in a thread of this process -----------------------------------------------------
@contextlib.contextmanager
def threaded_server(app, *, headers: dict[str, str] | None = None, ready_timeout: float = 120.0,
                    timeout: float = 60.0, **config) -> Iterator[httpx.Client]:
    """A real uvicorn server (softknn.service.server.uvicorn_config, `config` on top) in a thread of this
    process, on a socket it holds; yields an httpx.Client on it (`.app` = the app) once /readyz
    answers 200. The app shares this process's model: no model load, no second process."""
    import uvicorn

    from softknn.service.server import uvicorn_config

    sock = bound_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, host=HOST, port=port, **{"timeout_graceful_shutdown": 5, **config}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://{HOST}:{port}", timeout=timeout, headers=headers)
    try:
        wait_ready(client, ready_timeout, interval=0.05)
        client.app = app  # type: ignore[attr-defined]  # the running app, for tests that reach into it
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(30)
        sock.close()


# --- hostile requests -------------------------------------------------------------------------
MB = 1_000_000
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Limits:
    """The server limits the catalogue is written against (Settings.limits and the schema bounds)."""

    max_k: int = 256
    max_evidence: int = 50
    max_body_bytes: int = 2_000_000


@dataclass(frozen=True)
class Hostile:
    name: str
    body: Callable[[Limits], bytes]  # the raw request body
    status: int  # the expected answer
    kind: str | None  # the expected error.type (None for a 200)
    streamed: bool = False  # sent without Content-Length, in 100 kB pieces

    def content(self, lim: Limits, *, asynchronous: bool = False):
        """The body: bytes, or (streamed) an iterator of pieces, async for an httpx.AsyncClient."""
        raw = self.body(lim)
        if not self.streamed:
            return raw
        pieces = [raw[i : i + 100_000] for i in range(0, len(raw), 100_000)]
        if not asynchronous:
            return iter(pieces)

        async def agen():
            for p in pieces:
                yield p

        return agen()


def _j(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def _raw(text: str) -> Callable[[Limits], bytes]:
    return lambda lim: text.encode()


HOSTILE: list[Hostile] = [
    # size
    Hostile("body_10MB", lambda lim: b" " * (10 * MB), 413, "payload_too_large"),
    Hostile("body_10MB_streamed", lambda lim: b" " * (10 * MB), 413, "payload_too_large", streamed=True),
    Hostile("inputs_10000", lambda lim: _j({"inputs": ["a"] * 10_000}), 413, "input_too_large"),
    Hostile("string_1MB", lambda lim: _j({"inputs": ["x" * MB]}), 413, "input_too_large"),
    Hostile("string_1MB_truncate", lambda lim: _j({"inputs": ["ferry " * (MB // 6)], "truncate": True,
                                                   "evidence": 0}), 200, None),
    # structure and encoding
    Hostile("nested_arrays_100k", lambda lim: b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400, "malformed_json"),
    Hostile("nested_objects_50k", lambda lim: b'{"inputs": ["a"], "x": ' + b'{"a":' * 50_000 + b"1"
            + b"}" * 50_000 + b"}", 400, "malformed_json"),
    Hostile("nested_arrays_200", lambda lim: b'{"inputs": ' + b"[" * 200 + b"]" * 200 + b"}", 422,
            "validation_error"),
    Hostile("invalid_utf8", lambda lim: b'{"inputs": ["\xff\xfe caf\xe9"]}', 400, "malformed_json"),
    Hostile("raw_nul_byte", lambda lim: b'{"inputs": ["a\x00b"]}', 400, "malformed_json"),
    Hostile("nul_char_text", _raw('{"inputs": ["\\u0000 ferry"], "evidence": 0}'), 200, None),
    Hostile("lone_surrogate", _raw('{"inputs": ["a\\udc80"]}'), 422, "validation_error"),
    Hostile("int_5000_digits", lambda lim: b'{"inputs": ["a"], "k": ' + b"9" * 5000 + b"}", 400, "malformed_json"),
    # numbers at and past their bounds
    Hostile("k_1", lambda lim: _j({"inputs": ["dogs?"], "k": 1, "evidence": 0}), 200, None),
    Hostile("k_max", lambda lim: _j({"inputs": ["dogs?"], "k": lim.max_k, "evidence": 1}), 200, None),
    Hostile("k_max_plus_1", lambda lim: _j({"inputs": ["dogs?"], "k": lim.max_k + 1}), 422, "validation_error"),
    Hostile("k_0", lambda lim: _j({"inputs": ["dogs?"], "k": 0}), 422, "validation_error"),
    Hostile("k_negative", lambda lim: _j({"inputs": ["dogs?"], "k": -1}), 422, "validation_error"),
    Hostile("k_2_pow_64", lambda lim: _j({"inputs": ["dogs?"], "k": 2**64}), 422, "validation_error"),
    Hostile("alpha_0", lambda lim: _j({"inputs": ["dogs?"], "alpha": 0, "evidence": 0}), 200, None),
    Hostile("alpha_1", lambda lim: _j({"inputs": ["dogs?"], "alpha": 1, "evidence": 0}), 200, None),
    Hostile("alpha_below_0", lambda lim: _j({"inputs": ["dogs?"], "alpha": -1e-9}), 422, "validation_error"),
    Hostile("alpha_above_1", lambda lim: _j({"inputs": ["dogs?"], "alpha": 1.000001}), 422, "validation_error"),
    Hostile("alpha_NaN", _raw('{"inputs": ["dogs?"], "alpha": NaN}'), 422, "validation_error"),
    Hostile("alpha_minus_Infinity", _raw('{"inputs": ["dogs?"], "alpha": -Infinity}'), 422, "validation_error"),
    Hostile("temperature_Infinity", _raw('{"inputs": ["dogs?"], "temperature": Infinity}'), 422,
            "validation_error"),
    Hostile("temperature_1e999", _raw('{"inputs": ["dogs?"], "temperature": 1e999}'), 422, "validation_error"),
    Hostile("temperature_min", lambda lim: _j({"inputs": ["dogs?"], "temperature": 1e-6, "evidence": 0}), 200, None),
    Hostile("temperature_max", lambda lim: _j({"inputs": ["dogs?"], "temperature": 1e6, "evidence": 0}), 200, None),
    Hostile("temperature_below_min", lambda lim: _j({"inputs": ["dogs?"], "temperature": 1e-7}), 422,
            "validation_error"),
    Hostile("threshold_1", lambda lim: _j({"inputs": ["dogs?"], "threshold": 1}), 422, "validation_error"),
    Hostile("evidence_past_max", lambda lim: _j({"inputs": ["dogs?"], "evidence": lim.max_evidence + 1}), 422,
            "validation_error"),
]


async def send_hostile(client: httpx.AsyncClient, h: Hostile, lim: Limits) -> tuple[int | str, float, str | None]:
    """(status or transport error name, seconds, error.type)."""
    t0 = time.perf_counter()
    try:
        r = await client.post("/v1/infer", content=h.content(lim, asynchronous=True), headers=JSON)
    except httpx.TransportError as e:
        return type(e).__name__, time.perf_counter() - t0, None
    dt = time.perf_counter() - t0
    kind = r.json()["error"]["type"] if r.status_code >= 400 else None
    return r.status_code, dt, kind


class SlowBody(NamedTuple):
    status: int | str  # the HTTP status, or the exception's name when no answer could be read
    seconds: float  # until the answer's head arrived
    closed: bool  # the server then closed the connection (EOF)
    error: str | None  # the JSON error body's error.type; None if there was no such body


async def slow_body(url: str, *, byte_every_s: float = 0.25, give_up_s: float = 60.0) -> SlowBody:
    """A slow-loris client: headers at once, then one body byte every `byte_every_s`, reading the
    answer as soon as one arrives (it keeps sending until then, like a client behind a slow link)."""
    host, port = url.removeprefix("http://").split(":")
    body = _j({"inputs": ["a slow client is sending this text"]})
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /v1/infer HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    t0 = time.perf_counter()
    writer.write(head)
    await writer.drain()
    try:
        read = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        for b in body:
            done, _ = await asyncio.wait({read}, timeout=byte_every_s)
            if done:
                break
            writer.write(bytes([b]))
            await writer.drain()
        head_bytes = await asyncio.wait_for(read, give_up_s)
        dt = time.perf_counter() - t0
        status = int(head_bytes.split(b" ", 2)[1])
        length = re.search(rb"(?im)^content-length:\s*(\d+)\r$", head_bytes)
        payload = await asyncio.wait_for(reader.readexactly(int(length.group(1))), 5.0) if length else b""
        rest = await asyncio.wait_for(reader.read(), 5.0)  # b"" … EOF: the server closed it
        closed = reader.at_eof() and rest == b""
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        return SlowBody(type(e).__name__, time.perf_counter() - t0, True, None)
    finally:
        writer.close()
    try:
        error = json.loads(payload)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        error = None
    return SlowBody(status, dt, closed, error)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.harness wait-ready URL [--timeout S] [--pid PID] [--log FILE]`: the shell scripts'
    readiness wait (scripts/load_smoke.sh), the same poll as the tests'. Exit 0 when ready, 1 otherwise."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.harness")
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wait-ready", help="poll URL/readyz until 200")
    w.add_argument("url")
    w.add_argument("--timeout", type=float, default=240.0)
    w.add_argument("--pid", type=int, default=None, help="fail as soon as this process exits")
    w.add_argument("--log", type=Path, default=None, help="print this log's tail on failure")
    args = ap.parse_args(argv)
    with httpx.Client(base_url=args.url, timeout=5.0) as client:
        try:
            wait_ready(client, args.timeout, pid=args.pid, log_path=args.log, interval=0.5)
        except (RuntimeError, TimeoutError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
