"""Run the load test headless and fail on any unexpected error.

    python -m loadtest.run --host http://127.0.0.1:8000 --users 8 --duration 30 [--out DIR]
    python -m loadtest.run --host URL --levels 1,4,16 --duration 60 --generation only --out DIR

1. checks once (through the generated client) that GET /readyz answers 200, and exits 2 when it does
   not: the caller waits for readiness (docker compose's `service_healthy`, scripts/load_smoke.sh
   through the tests' harness, tests/harness.py), so a load test never starts against a service still loading;
   then decides generation (--generation auto: the generation tasks join the mix when the service
   serves a generator, loadtest.generation.served_generator; only: they alone, exit 2 without a generator;
   off: never);
2. runs locust headless on loadtest/locustfile.py: --users users started at --spawn-rate per second,
   for --duration seconds (calls in flight at the end finish, up to --stop-timeout), in a
   subprocess with a hard wall-clock cap;
3. prints and writes the summary (summary.json, summary.csv, failures.csv; locust's own CSVs
   locust_*.csv beside them) to --out (default $LOADTEST_OUT or build/loadtest);
4. exits 0 only when locust exited 0, the summary exists, at least one call was made and no call
   got an unexpected answer (an expected 4xx of the invalid requests is a success).

--levels 1,4,16 runs steps 2–4 once per user count, into --out/users-N/, then writes the combined
report (levels.json, levels.csv: calls, failures, TTFT p50/p99, tokens/s per user per level) to
--out and prints it; it exits non-zero when any level did.

Users and duration are bounded (≤ 256 users, ≤ 3600 s): this drives a service you run, on hosts
you own. Env: SOFTKNN_AUTH__API_KEY (bearer key, when the service has one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from loadtest import report

MAX_USERS, MAX_DURATION_S = 256, 3600
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def check_ready(host: str, timeout_s: float) -> str | None:
    """One GET /readyz with the generated client: None when it answers 200, else what it answered."""
    import httpx
    from softknn_client import Client
    from softknn_client.api.health import readyz

    with Client(base_url=host, timeout=httpx.Timeout(timeout_s)) as client:
        try:
            r = readyz.sync_detailed(client=client)
        except httpx.TransportError as e:
            return repr(e)
    return None if r.status_code == 200 else f"{int(r.status_code)} {r.content[:200]!r}"


def served_generator(host: str, timeout_s: float) -> str | None:
    """The generator the service serves (loadtest.generation.served_generator), through the generated client."""
    import httpx
    from softknn_client import AuthenticatedClient

    from loadtest.generation import served_generator as ask

    token = os.environ.get("SOFTKNN_AUTH__API_KEY") or "none"
    with AuthenticatedClient(base_url=host, token=token, timeout=httpx.Timeout(timeout_s)) as client:
        return ask(client)


def warm_up(host: str, timeout_s: float) -> tuple[float, str | None]:
    """One short /v1/generate through the generated client: (seconds, None) on 200, else (seconds, what
    it answered). The service builds its decode graph at the first generation, not before /readyz."""
    import time

    import httpx
    from softknn_client import AuthenticatedClient
    from softknn_client.api.generation import generate
    from softknn_client.models import GenerateRequest

    token = os.environ.get("SOFTKNN_AUTH__API_KEY") or "none"
    t0 = time.perf_counter()
    with AuthenticatedClient(base_url=host, token=token, timeout=httpx.Timeout(timeout_s)) as client:
        r = generate.sync_detailed(client=client, body=GenerateRequest(prompt="warm-up", max_tokens=2))
    problem = None if r.status_code == 200 else f"{int(r.status_code)} {r.content[:200]!r}"
    return time.perf_counter() - t0, problem


def locust_command(args: argparse.Namespace, out: Path, users: int, generator: str | None) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", args.host,
            "--users", str(users), "--spawn-rate", str(args.spawn_rate or users),
            "--run-time", f"{args.duration}s", "--stop-timeout", str(args.stop_timeout),
            "--csv", str(out / "locust"), "--only-summary", "--loglevel", "WARNING",
            "--summary-dir", str(out), "--mix-seed", str(args.seed), "--wait-range", args.wait,
            "--request-timeout", str(args.request_timeout), "--generator", generator or "none",
            *(["--generation-only"] if args.generation == "only" else [])]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--users", type=int, default=8, help=f"concurrent users (1..{MAX_USERS}); default 8")
    ap.add_argument("--duration", type=int, default=30, help=f"seconds of load (1..{MAX_DURATION_S}); default 30")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("LOADTEST_OUT") or "build/loadtest"),
                    help="summary directory (default $LOADTEST_OUT or build/loadtest)")
    ap.add_argument("--spawn-rate", type=float, default=0, help="users started per second (default: all in 1 s)")
    ap.add_argument("--seed", type=int, default=0, help="request-mix seed (default 0)")
    ap.add_argument("--wait", default="0.1,0.5", help="think time between a user's calls, 'MIN,MAX' s")
    ap.add_argument("--request-timeout", type=float, default=60.0, help="client timeout per call, s")
    ap.add_argument("--stop-timeout", type=int, default=30, help="s for calls in flight at the end to finish")
    ap.add_argument("--ready-timeout", type=float, default=10.0, help="s for the one /readyz check before starting")
    ap.add_argument("--generation", choices=["auto", "off", "only"], default="auto",
                    help="auto: the generation tasks join the mix when the service serves a generator (GET "
                         "/v1/models); only: the generation tasks alone; off: never (default auto)")
    ap.add_argument("--warmup", action="store_true", help="with a generator: one short generation before the "
                    "load, its time printed (the first generation builds the decode graph)")
    ap.add_argument("--levels", default="", help="user counts to run one after another, e.g. 1,4,16 (each into "
                    "--out/users-N/, plus levels.json/levels.csv); replaces --users")
    args = ap.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.levels.split(",")] if args.levels else []
    except ValueError:
        ap.error(f"--levels {args.levels!r}: expected user counts separated by commas, e.g. 1,4,16")
    for n in [args.users, *args.levels]:
        if not 1 <= n <= MAX_USERS:
            ap.error(f"--users/--levels {n}: must be 1..{MAX_USERS}")
    if not 1 <= args.duration <= MAX_DURATION_S:
        ap.error(f"--duration {args.duration}: must be 1..{MAX_DURATION_S}")
    lo, _, hi = args.wait.partition(",")
    try:
        ok = 0 <= float(lo) <= float(hi)
    except ValueError:
        ok = False
    if not ok:
        ap.error(f"--wait {args.wait!r}: expected 'MIN,MAX' seconds with 0 <= MIN <= MAX")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "summary.json", out / "levels.json"):
        stale.unlink(missing_ok=True)  # never report a previous run's figures
    not_ready = check_ready(args.host, args.ready_timeout)
    if not_ready is not None:
        print(f"error: {args.host}/readyz is not 200 (wait for readiness before a load test): {not_ready}",
              file=sys.stderr)
        return 2
    ok, generator, warmup_s = decide_generation(args)
    if not ok:
        return 2
    if not args.levels:
        return run_locust(args, out, args.users, generator)
    rcs, rows = [], []
    for users in args.levels:
        level_out = out / f"users-{users}"
        level_out.mkdir(parents=True, exist_ok=True)
        (level_out / "summary.json").unlink(missing_ok=True)
        rcs.append(run_locust(args, level_out, users, generator))
        if (level_out / "summary.json").is_file():
            rows.append(report.level_row(json.loads((level_out / "summary.json").read_text())))
    meta = {"host": args.host, "duration_s": args.duration, "seed": args.seed, "wait_range_s": args.wait,
            "generator": generator, "generation": args.generation, "warmup_s": warmup_s,
            "exit_codes": dict(zip(args.levels, rcs))}
    print(report.levels_table(rows), flush=True)
    for p in report.write_levels(rows, meta, out):
        print(f"wrote {p}", flush=True)
    return max(rcs)


def decide_generation(args: argparse.Namespace) -> tuple[bool, str | None, float | None]:
    """(ok, the served generator or None, the warm-up's seconds or None); not ok when the run must not
    start: --generation only without a generator, GET /v1/models or /v1/index not answering, a
    warm-up that failed. Prints what it decided."""
    import httpx

    try:
        generator = None if args.generation == "off" else served_generator(args.host, args.ready_timeout)
    except (RuntimeError, httpx.HTTPError) as e:
        print(f"error: could not ask {args.host} for its generator: {e}", file=sys.stderr)
        return False, None, None
    if args.generation == "only" and generator is None:
        print(f"error: --generation only: {args.host} serves no generator (GET /v1/models lists none besides the "
              "encoder)", file=sys.stderr)
        return False, None, None
    why = "" if generator or args.generation == "off" else ": the service serves no generator"
    print(f"generation: {generator or 'off'} ({args.generation}{why})", flush=True)
    if not (args.warmup and generator):
        return True, generator, None
    seconds, problem = warm_up(args.host, args.request_timeout)
    print(f"warm-up generation: {seconds:.1f} s{'' if problem is None else ': ' + problem}", flush=True)
    return problem is None, generator, seconds


def run_locust(args: argparse.Namespace, out: Path, users: int, generator: str | None) -> int:
    """One locust run of `users` users into `out`; its verdict."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(LOCUSTFILE.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cap = args.duration + args.stop_timeout + 120  # locust's own start/stop; past this it is hung
    print(f"load test: {users} users for {args.duration} s against {args.host} → {out}", flush=True)
    try:
        rc = subprocess.run(locust_command(args, out, users, generator), env=env, timeout=cap).returncode
    except subprocess.TimeoutExpired:
        print(f"error: locust still running after {cap} s: killed", file=sys.stderr)
        return 3
    return verdict(rc, out / "summary.json")


def verdict(locust_rc: int, summary_path: Path) -> int:
    """0 when locust exited 0 and the summary shows calls and no unexpected failure; else 1."""
    if not summary_path.is_file():
        print(f"error: no summary at {summary_path} (locust exit {locust_rc})", file=sys.stderr)
        return 1
    s = json.loads(summary_path.read_text())
    problems = []
    if s["requests"] == 0:
        problems.append("no call was made")
    if s["unexpected_failures"]:
        problems.append(f"{s['unexpected_failures']} unexpected failures {s['failures_by_type']}; "
                        f"first of each: {json.dumps(s['failure_examples'], ensure_ascii=False)[:2000]}")
    if locust_rc != 0 and not problems:
        problems.append(f"locust exited {locust_rc}")
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    lat, gen = s["latency_ms"], s.get("generation")
    if gen:
        ttft, rate = gen["ttft_ms"], gen["tokens_per_s_per_user"]
        print(f"generation: {gen['calls']} answers, {gen['streams']} streams, TTFT p50 {_num(ttft['p50'])} ms, "
              f"p99 {_num(ttft['p99'])} ms, tokens/s per user p50 {_num(rate['p50'], '.1f')}", flush=True)
    print(f"OK: {s['requests']} calls, {s['requests_per_s']:.2f} req/s, {s['infer_texts_per_s']:.2f} texts/s, "
          f"p50 {lat['p50_ms']:.0f} ms, p95 {lat['p95_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, "
          f"0 unexpected failures, {sum(s['expected_refusals_by_type'].values())} expected refusals", flush=True)
    return 0


def _num(x: float | None, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)  # summary.json writes NaN as null


if __name__ == "__main__":
    sys.exit(main())
