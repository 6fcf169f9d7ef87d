"""The locust User of the load test: every call goes through the generated client (clients/python).

Each task draws one call from loadtest.mix, makes it with the client, times it (client-side: request,
response and parsing into the typed models), checks it (loadtest.mix.verify) and fires locust's
`request` event: a call that got its expected status — including the deliberate 4xx, named by type,
e.g. "/v1/infer [invalid:k_zero]" — is a success; anything else is a failure named by type
("status_503:timeout", "bad_response", "client_error:ReadTimeout", ...). At the end, the summary
(loadtest.report) goes to --summary-dir. Run it through `python -m loadtest.run`, or directly:

    locust -f loadtest/locustfile.py --headless --host URL -u 8 -r 8 -t 30s --summary-dir DIR

Generation (loadtest.mix): --generator auto (the default) asks the service at the start whether it
serves one (loadtest.generation.served_generator); a name skips the question, "none" leaves generation
out; --generation-only draws the generation tasks alone. A user that got 429 with Retry-After
waits that long (at most RETRY_AFTER_CAP_S) before its next call.

Env: SOFTKNN_AUTH__API_KEY (the bearer key, when the service has one).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from locust import User, events, task  # first: locust patches the standard library for gevent

if __package__ in (None, ""):  # locust loads this file by path: make the `loadtest` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from softknn_client import AuthenticatedClient  # noqa: E402

from loadtest import report  # noqa: E402
from loadtest.generation import gen_stats, served_defaults, served_generator  # noqa: E402
from loadtest.mix import Mix, load_queries, refusal, retry_after_s, verify  # noqa: E402

RECORDER = report.Recorder()
QUERIES = load_queries()
SEEN_CHUNKS: list[str] = []  # chunk ids from evidence, shared by the users (for /v1/entries)
GENERATOR: dict[str, str | None] = {"name": None}  # the served generator, decided at the test's start
DEFAULTS: dict[str, Any] = {}  # the server's /v1/infer defaults (GET /v1/index), read at the test's start
RETRY_AFTER_CAP_S = 10.0
_user_ids = itertools.count()


def _client(host: str, timeout_s: float) -> AuthenticatedClient:
    # Any token passes a service without an API key; with one, the key from the environment.
    return AuthenticatedClient(base_url=host, token=os.environ.get("SOFTKNN_AUTH__API_KEY") or "none",
                               timeout=httpx.Timeout(timeout_s))


class UnexpectedResponse(Exception):
    """What locust's failure table shows: the failure type (the message is in the summary's examples)."""


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--summary-dir", type=str, env_var="LOADTEST_OUT", default="",
                        help="write summary.json/summary.csv/failures.csv here at the end")
    parser.add_argument("--mix-seed", type=int, env_var="LOADTEST_SEED", default=0,
                        help="seed of the request mix (user i draws from seed + i)")
    parser.add_argument("--wait-range", type=str, env_var="LOADTEST_WAIT", default="0.1,0.5",
                        help="think time between a user's calls: 'MIN,MAX' seconds, uniform")
    parser.add_argument("--request-timeout", type=float, env_var="LOADTEST_REQUEST_TIMEOUT", default=60.0,
                        help="client timeout per call, seconds")
    parser.add_argument("--generator", type=str, env_var="LOADTEST_GENERATOR", default="auto",
                        help="the served generator's id; auto: ask GET /v1/models at the start; none: no generation")
    parser.add_argument("--generation-only", action="store_true", env_var="LOADTEST_GENERATION_ONLY", default=False,
                        help="draw only the generation tasks (needs a served generator)")


@events.test_start.add_listener
def _start(environment, **_) -> None:
    opts = environment.parsed_options
    name = opts.generator
    with _client(environment.host, opts.request_timeout) as client:
        DEFAULTS.update(served_defaults(client))
        if name == "auto":
            name = served_generator(client)
    GENERATOR["name"] = None if name in (None, "", "none") else name
    if opts.generation_only and GENERATOR["name"] is None:  # loadtest.run refuses this before locust starts
        logging.error("--generation-only without a generator (--generator %s; %s); stopping", opts.generator,
                      environment.host)
        import gevent  # after locust's monkey-patching

        environment.process_exit_code = 2
        gevent.spawn(environment.runner.quit)
    RECORDER.started = time.monotonic()


@events.test_stop.add_listener
def _stop(environment, **_) -> None:
    RECORDER.stopped = time.monotonic()


@events.quitting.add_listener
def _quit(environment, **_) -> None:
    if RECORDER.started is None:
        return
    if RECORDER.stopped is None:
        RECORDER.stopped = time.monotonic()
    opts = environment.parsed_options
    meta = {"host": environment.host, "users": opts.num_users, "run_time_s": opts.run_time,
            "seed": opts.mix_seed, "wait_range_s": opts.wait_range, "generator": GENERATOR["name"],
            "generation_only": bool(opts.generation_only)}
    summary = RECORDER.summary(meta)
    print(report.table(summary), flush=True)
    if opts.summary_dir:
        for p in report.write(summary, Path(opts.summary_dir)):
            print(f"wrote {p}", flush=True)


class SoftknnUser(User):
    """One simulated client application: its own connection pool, its own seeded request mix."""

    def __init__(self, environment) -> None:
        super().__init__(environment)
        opts = environment.parsed_options
        uid = next(_user_ids)
        self.mix = Mix(QUERIES, seed=opts.mix_seed + uid, seen_chunks=SEEN_CHUNKS, generator=GENERATOR["name"],
                       generation_only=opts.generation_only and GENERATOR["name"] is not None, defaults=DEFAULTS)
        lo, hi = (float(x) for x in opts.wait_range.split(","))
        self._wait = (lo, hi)
        self._retry_after = 0.0  # the last 429's Retry-After, honoured by the next wait
        self.client = _client(self.host, opts.request_timeout)

    def wait_time(self) -> float:
        think, self._retry_after = max(self.mix.rng.uniform(*self._wait), self._retry_after), 0.0
        return think

    def on_stop(self) -> None:
        self.client.get_httpx_client().close()

    @task
    def call(self) -> None:
        call = self.mix.draw()
        t0, start = time.time(), time.perf_counter()
        response, failure = None, None
        try:
            response = call.send(self.client)
        except Exception as e:  # transport errors, timeouts, a body the models cannot parse
            failure = (f"client_error:{type(e).__name__}", f"{call.name}: {e!r}")
        else:
            failure = verify(call, response)
        ms = (time.perf_counter() - start) * 1000
        refused, gen = None, None
        if failure is None and response is not None:
            refused, gen = refusal(call, response), gen_stats(response)
            if refused is not None and refused.startswith("429 "):
                self._retry_after = min(float(retry_after_s(response) or 0), RETRY_AFTER_CAP_S)
        RECORDER.record(call.name, call.method, ms, failure=failure, refusal=refused, texts=call.texts, gen=gen)
        self.environment.events.request.fire(
            request_type=call.method, name=call.name, response_time=ms,
            response_length=len(response.content) if response is not None else 0,
            exception=UnexpectedResponse(failure[0]) if failure else None,
            context={"kind": call.kind, "status": int(response.status_code) if response is not None else None},
            start_time=t0, url=call.path, response=None)
