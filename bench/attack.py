"""Hostile inputs against a live server, and what they cost its well-formed clients.

    python -m bench attack                                   # sample bundle, 15 s per phase
    python -m bench attack --duration 30 --out bench/results/attack.json

Starts `python -m softknn.service.cli` (API key set, one torch thread, limits.body_timeout_s = 2) on a
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

HOSTILE (tests/harness.py) is also the table of tests/reliability/test_hostile.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.harness import (
    API_KEY,
    HOSTILE,
    REPO,
    Limits,
    LiveServer,
    ensure_bundle,
    latency_summary,
    rss_bytes,
    send_hostile,
    slow_body,
)

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


def attack(bundle: Path, *, duration: float = 15.0, clients: int = 4, attackers: int = 2, loris_n: int = 8,
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


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bundle", type=Path, default=REPO / "bundles" / "sample",
                    help="bundle to serve (built from the sample KB if missing)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--attackers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=20.0, help="hostile requests/s per attacker (0: flat out)")
    ap.add_argument("--loris", type=int, default=8, help="concurrent slow-body connections")
    ap.add_argument("--out", type=Path)


def run(args: argparse.Namespace) -> dict:
    figure = attack(ensure_bundle(args.bundle), duration=args.duration, clients=args.clients,
                    attackers=args.attackers, loris_n=args.loris, rate=args.rate)
    text = json.dumps(figure, indent=2, sort_keys=True, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return figure


if __name__ == "__main__":  # python -m bench attack: the same as python -m bench attack
    import sys

    from bench.__main__ import main

    main(["attack", *sys.argv[1:]])
