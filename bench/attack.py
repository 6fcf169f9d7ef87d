"""Hostile inputs against a live server, and what they cost its well-formed clients (issue 7).

    python bench/attack.py                                   # sample bundle, 15 s per phase
    python bench/attack.py --duration 30 --out bench/results/attack.json

Starts `python -m service.cli` (API key set, one torch thread, limits.body_timeout_s = 2) on a
free port of 127.0.0.1, then runs three phases of `--duration` seconds each:
    baseline   `--clients` well-formed clients, each sending one-input requests back to back
    attack     the same clients, plus `--attackers` tasks cycling through HOSTILE (10 MB bodies,
               10,000 inputs, 1 MB strings, deep nesting, invalid UTF-8, NUL bytes, values at and
               past their bounds, NaN/inf) at `--rate` requests/s each, and `--loris` slow-loris
               connections trickling a body
    recovery   the well-formed clients alone again
and samples the server's RSS every 0.1 s. It prints (and writes with --out) one JSON figure:
per phase the well-formed latency (p50/p95/p99/max) and statuses, the RSS (MB), and per hostile
kind the statuses it got and how fast (p50/p99). Every hostile request must get its expected
status; every well-formed one 200.

HOSTILE is also the table of tests/reliability/test_hostile.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx

if __package__ in (None, ""):  # python bench/attack.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.live_server import API_KEY, REPO, LiveServer, ensure_bundle, latency_summary, rss_bytes  # noqa: E402

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


# --- the load ---------------------------------------------------------------------------------
QUERIES = ["Can I bring my dog?", "How long does a refund take?", "Is the ferry cancelled in a storm?",
           "Where can I eat on board?", "I lost my wallet on the boat", "Do saver fares get refunded?"]


async def well_formed(url: str, stop: asyncio.Event, out: dict, i: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        n = i
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await c.post("/v1/infer", json={"inputs": [QUERIES[n % len(QUERIES)]], "evidence": 3})
                status = r.status_code
            except httpx.TransportError as e:
                status = type(e).__name__
            out["statuses"][status] += 1
            if status == 200:
                out["latency"].append(time.perf_counter() - t0)
            n += 1


async def attacker(url: str, stop: asyncio.Event, out: dict, lim: Limits, offset: int, rate: float) -> None:
    """Cycle through the refused kinds (the 200s are checked by the test), `rate` requests/s (0: flat out)."""
    items = [h for h in HOSTILE if h.status != 200]
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        n, t_next = offset, time.monotonic()
        while not stop.is_set():
            if rate > 0:
                t_next += 1.0 / rate
                await asyncio.sleep(max(0.0, t_next - time.monotonic()))
            h = items[n % len(items)]
            status, dt, kind = await send_hostile(c, h, lim)
            rec = out.setdefault(h.name, {"expected": h.status, "statuses": Counter(), "seconds": []})
            rec["statuses"][status if kind in (None, h.kind) else f"{status}:{kind}"] += 1
            rec["seconds"].append(dt)
            n += 1


async def loris(url: str, stop: asyncio.Event, out: dict) -> None:
    while not stop.is_set():
        status, dt, closed, _ = await slow_body(url)
        rec = out.setdefault("slow_body", {"expected": 408, "statuses": Counter(), "seconds": [], "closed": 0})
        rec["statuses"][status] += 1
        rec["seconds"].append(dt)
        rec["closed"] += closed


async def sample_rss(pid: int, stop: asyncio.Event, out: list[int]) -> None:
    while not stop.is_set():
        out.append(rss_bytes(pid))
        await asyncio.sleep(0.1)


async def phase(url: str, pid: int, duration: float, clients: int, attackers: int = 0, loris_n: int = 0,
                lim: Limits = Limits(), rate: float = 0.0) -> dict:
    stop = asyncio.Event()
    good = {"statuses": Counter(), "latency": []}
    attacks: dict = {}
    rss: list[int] = []
    tasks = [asyncio.create_task(well_formed(url, stop, good, i)) for i in range(clients)]
    tasks += [asyncio.create_task(attacker(url, stop, attacks, lim, 7 * i, rate)) for i in range(attackers)]
    tasks += [asyncio.create_task(loris(url, stop, attacks)) for _ in range(loris_n)]
    tasks.append(asyncio.create_task(sample_rss(pid, stop, rss)))
    t0 = time.monotonic()
    await asyncio.sleep(duration)
    stop.set()
    await asyncio.gather(*tasks)
    out = {
        "seconds": round(time.monotonic() - t0, 1),
        "well_formed": {**latency_summary(good["latency"]), "statuses": _keys(good["statuses"])},
        "rss_mb": {"max": round(max(rss) / 1e6, 1), "mean": round(sum(rss) / len(rss) / 1e6, 1)},
    }
    if attacks:
        out["hostile"] = {name: {"expected": rec["expected"], "statuses": _keys(rec["statuses"]),
                                 **{k: v for k, v in latency_summary(rec["seconds"]).items() if k != "max_ms"},
                                 **({"closed_after": rec["closed"]} if "closed" in rec else {})}
                          for name, rec in sorted(attacks.items())}
    return out


def _keys(c: Counter) -> dict[str, int]:
    return {str(k): v for k, v in sorted(c.items(), key=lambda kv: str(kv[0]))}


async def run_phases(url: str, pid: int, duration: float, clients: int, attackers: int, loris_n: int,
                     lim: Limits, rate: float) -> dict:
    base = await phase(url, pid, duration, clients, lim=lim)
    attack = await phase(url, pid, duration, clients, attackers, loris_n, lim, rate)
    recovery = await phase(url, pid, duration, clients, lim=lim)
    return {"baseline": base, "attack": attack, "recovery": recovery}


def run(bundle: Path, *, duration: float = 15.0, clients: int = 4, attackers: int = 2, loris_n: int = 8,
        rate: float = 20.0, log_dir: Path | None = None) -> dict:
    """Start a server on `bundle`, run the three phases, stop it; the figure as a dict."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="softknn-attack-"))
    env = {"SOFTKNN_LIMITS__BODY_TIMEOUT_S": "2"}
    with LiveServer.start(bundle, log_dir / "server.log", env=env) as srv:
        idle_rss = srv.rss()
        phases = asyncio.run(run_phases(srv.url, srv.proc.pid, duration, clients, attackers, loris_n, Limits(), rate))
        ready_after = srv.client.get("/readyz").status_code
        errors_logged = srv.log().count('"level": "error"')
    return {
        "bench": "attack", "bundle": str(bundle), "duration_s_per_phase": duration, "clients": clients,
        "attackers": attackers, "attack_rate_per_attacker": rate, "slow_loris_connections": loris_n,
        "body_timeout_s": 2.0,
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "idle_rss_mb": round(idle_rss / 1e6, 1), "ready_after": ready_after, "errors_logged": errors_logged,
        **phases,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / "bundles" / "sample",
                    help="bundle to serve (built from the sample KB if missing)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--attackers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=20.0, help="hostile requests/s per attacker (0: flat out)")
    ap.add_argument("--loris", type=int, default=8, help="concurrent slow-body connections")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    figure = run(ensure_bundle(args.bundle), duration=args.duration, clients=args.clients,
                 attackers=args.attackers, loris_n=args.loris, rate=args.rate)
    text = json.dumps(figure, indent=2, sort_keys=True, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
