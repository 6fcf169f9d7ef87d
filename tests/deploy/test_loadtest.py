"""The load test's parts that need no locust: the request mix, the summary arithmetic, the verdict;
and its generation tasks against the real generator (the small generator bundle), in process."""

from __future__ import annotations

import csv
import json
import math
import time

import pytest
from loadtest import generation, mix, report, run


def test_percentile_interpolates_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert report.percentile(xs, 50) == 2.5
    assert report.percentile(xs, 95) == pytest.approx(3.85)
    assert (report.percentile(xs, 0), report.percentile(xs, 100)) == (1.0, 4.0)
    assert report.percentile([7.0], 99) == 7.0
    assert math.isnan(report.percentile([], 50))


def test_summary_counts_rates_failures_and_refusals(tmp_path):
    rec = report.Recorder()
    rec.started = 100.0
    for ms in (10.0, 20.0, 30.0):
        rec.record("/v1/infer [single]", "POST", ms, texts=1)
    rec.record("/v1/infer [batch]", "POST", 50.0, texts=4)
    rec.record("/v1/infer [invalid:k_zero]", "POST", 2.0, refusal="422 validation_error")
    rec.record("/v1/infer [batch]", "POST", 90.0, failure=("status_503:timeout", "first"), texts=4)
    rec.record("/v1/infer [batch]", "POST", 80.0, failure=("status_503:timeout", "second"), texts=4)
    rec.stopped = 110.0
    s = rec.summary({"users": 2})
    assert (s["users"], s["requests"], s["elapsed_s"]) == (2, 7, 10.0)
    assert s["requests_per_s"] == pytest.approx(0.7)
    assert s["infer_texts_per_s"] == pytest.approx(0.7)  # 3 singles + 1 ok batch of 4
    assert s["unexpected_failures"] == 2 and s["failures_by_type"] == {"status_503:timeout": 2}
    assert s["failure_examples"] == {"status_503:timeout": "first"}
    assert s["expected_refusals_by_type"] == {"422 validation_error": 1}
    assert s["ok"] is False
    assert s["latency_ms"]["p50_ms"] == 30.0 and s["latency_ms"]["max_ms"] == 90.0
    batch = next(r for r in s["by_name"] if r["name"] == "/v1/infer [batch]")
    assert (batch["requests"], batch["failures"], batch["p50_ms"]) == (3, 2, 80.0)

    paths = report.write(s, tmp_path)
    assert json.loads(paths[0].read_text())["requests"] == 7
    rows = list(csv.DictReader(paths[1].open()))
    assert [r["name"] for r in rows][-1] == "Aggregated" and rows[-1]["requests"] == "7"
    fails = list(csv.DictReader(paths[2].open()))
    assert {(r["kind"], r["type"], r["count"]) for r in fails} == {
        ("unexpected", "status_503:timeout", "2"), ("expected", "422 validation_error", "1")}
    assert "Aggregated" in report.table(s)


def _summary(tmp_path, **over):
    s = {"requests": 10, "unexpected_failures": 0, "failures_by_type": {}, "failure_examples": {},
         "requests_per_s": 1.0, "infer_texts_per_s": 2.0, "expected_refusals_by_type": {"422 validation_error": 1},
         "latency_ms": {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}, **over}
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(s))
    return p


def test_verdict_fails_on_unexpected_errors_missing_summary_or_no_calls(tmp_path, capsys):
    assert run.verdict(0, _summary(tmp_path)) == 0
    assert run.verdict(1, _summary(tmp_path)) == 1  # locust itself failed
    assert run.verdict(1, _summary(tmp_path, unexpected_failures=3, failures_by_type={"bad_response": 3})) == 1
    assert "3 unexpected failures" in capsys.readouterr().err
    assert run.verdict(0, _summary(tmp_path, requests=0)) == 1
    assert run.verdict(0, tmp_path / "absent.json") == 1


def test_users_and_duration_are_bounded(capsys):
    assert run.parse_args(["--host", "http://127.0.0.1:1", "--users", "8", "--duration", "30"]).users == 8
    for bad in (["--users", "0"], ["--users", "100000"], ["--duration", "0"], ["--duration", "86400"],
                ["--wait", "0.5,0.1"], ["--wait", "x"]):
        with pytest.raises(SystemExit):
            run.parse_args(["--host", "http://127.0.0.1:1", *bad])


def test_mix_is_five_percent_invalid_and_reproducible():
    assert sum(mix.WEIGHTS.values()) == 100 and mix.WEIGHTS["invalid"] == 5
    queries = mix.load_queries()
    assert len(queries) == 80

    def kinds(seed: int) -> list[str]:
        m = mix.Mix(queries, seed=seed)
        return [m.draw().kind for _ in range(2000)]

    draws = kinds(3)
    assert draws == kinds(3) and draws != kinds(4)
    invalid = [k for k in draws if k.startswith("invalid:")]
    assert 0.03 < len(invalid) / len(draws) < 0.07
    assert set(invalid) == {f"invalid:{w}" for w in mix.INVALID}


def test_verify_names_failures_by_status_and_error_type():
    from http import HTTPStatus

    from softknn_client.types import Response

    def response(status: int, content: bytes, parsed=None) -> Response:
        return Response(status_code=HTTPStatus(status), content=content, headers={}, parsed=parsed)

    call = mix.Mix(mix.load_queries(), seed=0).draw("single")
    body = b'{"error": {"type": "internal_error", "message": "boom", "field": null}}'
    assert mix.verify(call, response(500, body))[0] == "status_500:internal_error"  # undocumented: unparsed
    assert mix.verify(call, response(502, b"<html>bad gateway</html>"))[0] == "status_502:?"
    assert mix.verify(call, response(200, b"{}", parsed=None))[0] == "bad_body"


def test_a_load_test_against_a_service_that_is_not_ready_exits_2_before_any_call(tmp_path, capsys):
    """loadtest.run checks /readyz once and refuses to load a service that does not answer it (the
    caller waits for readiness: compose's service_healthy, load_smoke.sh's harness wait)."""
    from tests.harness import bound_socket

    with bound_socket() as sock:  # bound, never listening: refused
        host = f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert run.main(["--host", host, "--out", str(tmp_path), "--ready-timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {host}/readyz is not 200 (wait for readiness before a load test): ConnectError(")
    assert list(tmp_path.iterdir()) == []


# --- generation --------------------------------------------------------------------------------------
GEN_KINDS = {"generate", "generate_stream", "chat_stream"}


def test_generation_joins_the_mix_only_with_a_served_generator():
    assert sum(generation.GEN_WEIGHTS.values()) == 50 and generation.GEN_WEIGHTS["gen_invalid"] == 5
    assert mix.weights() == mix.WEIGHTS and mix.weights("smol", generation_only=True) == generation.GEN_WEIGHTS
    assert mix.weights("smol") == {**mix.WEIGHTS, **generation.GEN_WEIGHTS}
    with pytest.raises(ValueError):
        mix.weights(None, generation_only=True)
    queries = mix.load_queries()

    def kinds(**kw) -> list[str]:
        m = mix.Mix(queries, seed=5, **kw)
        return [m.draw().kind for _ in range(3000)]

    gen_names = GEN_KINDS | {f"invalid:{w}" for w in generation.GEN_INVALID}
    assert not gen_names & set(kinds())  # no generator: the inference mix alone
    both = kinds(generator="smol")
    share = sum(k in gen_names for k in both) / len(both)
    assert 0.29 < share < 0.38  # 50 of 150
    only = kinds(generator="smol", generation_only=True)
    assert set(only) == gen_names  # every generation task and every invalid field, nothing else
    assert 0.07 < sum(k.startswith("invalid:") for k in only) / len(only) < 0.13  # 5 of 50


def test_a_stream_measures_ttft_and_the_decode_rate_from_its_token_events():
    from loadtest.streams import Streamed

    s = Streamed(events=[{}] * 5, done=True, token_times=[0.5, 1.0, 1.5, 2.5])
    assert (s.ttft_s, s.tokens_per_s) == (0.5, 1.5)  # 3 tokens after the first, in 2.0 s
    assert Streamed(token_times=[0.25]).tokens_per_s is None and Streamed().ttft_s is None
    assert Streamed(token_times=[0.5, 0.5]).tokens_per_s is None  # no span: no rate


def test_summary_reports_ttft_p50_p99_and_tokens_per_s_per_user(tmp_path):
    rec = report.Recorder()
    rec.started = 0.0
    for ttft, rate in ((100.0, 10.0), (200.0, 20.0), (300.0, 30.0), (400.0, 40.0)):
        rec.record("/v1/generate [generate_stream]", "POST", 2000.0, gen=generation.GenStats(16, ttft, rate))
    rec.record("/v1/chat/completions [chat_stream]", "POST", 1000.0, gen=generation.GenStats(8, 500.0, None))
    rec.record("/v1/generate [generate]", "POST", 900.0, gen=generation.GenStats(12))
    rec.record("/v1/generate [generate]", "POST", 3.0, refusal="429 queue_full")
    rec.record("/v1/generate [generate_stream]", "POST", 9.0, failure=("bad_response", "x"),
               gen=generation.GenStats(99, 1.0, 1.0))
    rec.stopped = 10.0
    s = rec.summary({"generator": "smol"})
    gen = s["generation"]
    assert (gen["calls"], gen["tokens"], gen["streams"]) == (6, 4 * 16 + 8 + 12, 5)  # the failed call: not counted
    assert gen["tokens_per_s"] == pytest.approx(8.4)
    assert gen["ttft_ms"]["p50"] == 300.0 and gen["ttft_ms"]["p99"] == pytest.approx(496.0)
    assert gen["tokens_per_s_per_user"] == {"p50": 25.0, "p10": pytest.approx(13.0), "mean": 25.0}
    assert s["expected_refusals_by_type"] == {"429 queue_full": 1} and s["unexpected_failures"] == 1
    row = next(r for r in s["by_name"] if r["name"] == "/v1/generate [generate_stream]")
    assert (row["streams"], row["ttft_p50_ms"], row["ttft_p99_ms"], row["tokens_per_s_p50"]) == (
        4, 250.0, pytest.approx(397.0), 25.0)
    assert "streams" not in next(r for r in s["by_name"] if r["name"] == "/v1/generate [generate]")
    rows = {r["name"]: r for r in csv.DictReader(report.write(s, tmp_path)[1].open())}
    assert (rows["/v1/generate [generate_stream]"]["ttft_p50_ms"], rows["/v1/generate [generate]"]["ttft_p50_ms"]) == (
        "250.00", "")
    assert json.loads((tmp_path / "summary.json").read_text())["generation"]["streams"] == 5
    assert ("generation (smol): 6 answers, 84 tokens, 8.4 tokens/s in all; 5 streams: TTFT p50 300 ms, p99 496 ms; "
            "tokens/s per user p50 25.0, p10 13.0") in report.table(s)
    assert report.Recorder().summary()["generation"] is None


def _response(status: int, body: dict | None, headers: dict | None = None):
    from http import HTTPStatus

    from softknn_client.models import ErrorResponse
    from softknn_client.types import Response

    content = json.dumps(body).encode() if body is not None else b""
    parsed = ErrorResponse.from_dict(body) if body is not None and "error" in body else None
    return Response(status_code=HTTPStatus(status), content=content, headers=headers or {}, parsed=parsed)


def test_a_full_generation_queue_is_an_expected_refusal_only_with_a_retry_after():
    m = mix.Mix(mix.load_queries(), seed=0, generator="smol")
    full = {"error": {"type": "queue_full", "message": "generation queue full", "field": None}}
    for kind in GEN_KINDS:
        call = m.draw(kind)
        ok = _response(429, full, {"retry-after": "3"})
        assert mix.verify(call, ok) is None and mix.refusal(call, ok) == "429 queue_full" and mix.retry_after_s(ok) == 3
        assert mix.verify(call, _response(429, full))[0] == "no_retry_after:429"
        assert mix.verify(call, _response(429, full, {"retry-after": "soon"}))[0] == "no_retry_after:429"
        other = {"error": {"type": "timeout", "message": "m", "field": None}}
        assert mix.verify(call, _response(429, other, {"retry-after": "1"}))[0] == "wrong_error_type:timeout"
        assert mix.verify(call, _response(503, other, {"retry-after": "1"}))[0] == "status_503:timeout"
    single = m.draw("single")  # inference has no such allowance: its 429 is a failure
    assert mix.verify(single, _response(429, full, {"retry-after": "3"}))[0] == "status_429:queue_full"
    assert mix.refusal(single, _response(200, None)) is None


def test_levels_write_one_row_per_user_count(tmp_path):
    def summary(users: int, ttft: float | None) -> dict:
        gen = None if ttft is None else {"calls": 3, "tokens": 60, "tokens_per_s": 2.0, "streams": 2,
                                         "ttft_ms": {"p50": ttft, "p99": 2 * ttft, "mean": ttft},
                                         "tokens_per_s_per_user": {"p50": 9.5, "p10": 7.0, "mean": 9.0}}
        return {"users": users, "requests": 10, "unexpected_failures": 0, "requests_per_s": 0.5,
                "expected_refusals_by_type": {"422 validation_error": 2, "429 queue_full": 1},
                "latency_ms": {"p50_ms": 100.0, "p99_ms": 900.0}, "generation": gen}

    rows = [report.level_row(summary(1, 400.0)), report.level_row(summary(16, None))]
    assert rows[0] == {"users": 1, "requests": 10, "unexpected_failures": 0, "expected_refusals": 3,
                       "requests_per_s": 0.5, "p50_ms": 100.0, "p99_ms": 900.0, "gen_answers": 3,
                       "gen_tokens_per_s": 2.0, "streams": 2, "ttft_p50_ms": 400.0, "ttft_p99_ms": 800.0,
                       "tokens_per_s_per_user_p50": 9.5, "tokens_per_s_per_user_p10": 7.0}
    assert (rows[1]["streams"], rows[1]["ttft_p50_ms"], rows[1]["gen_answers"]) == (0, None, 0)
    paths = report.write_levels(rows, {"generator": "smol"}, tmp_path)
    assert json.loads(paths[0].read_text())["levels"][0]["ttft_p99_ms"] == 800.0
    lines = paths[1].read_text().splitlines()
    assert lines[0].split(",") == report.LEVEL_FIELDS
    assert lines[1] == "1,10,0,3,0.50,100.00,900.00,3,2.00,2,400.00,800.00,9.50,7.00"
    assert lines[2] == "16,10,0,3,0.50,100.00,900.00,0,,0,,,,"
    table = report.levels_table(rows).splitlines()
    assert table[2].split() == ["1", "10", "0", "3", "0.50", "100", "2", "400", "800", "9.5", "7.0", "2.0"]
    assert table[3].split()[-6:] == ["0", "—", "—", "—", "—", "—"]


def test_levels_and_generation_flags_are_checked():
    args = run.parse_args(["--host", "http://127.0.0.1:1", "--levels", "1,4,16", "--generation", "only"])
    assert (args.levels, args.generation, args.warmup) == ([1, 4, 16], "only", False)
    assert run.parse_args(["--host", "http://127.0.0.1:1"]).levels == []
    for bad in (["--levels", "1,0"], ["--levels", "4,300"], ["--levels", "one"], ["--generation", "maybe"]):
        with pytest.raises(SystemExit):
            run.parse_args(["--host", "http://127.0.0.1:1", *bad])
    cmd = run.locust_command(args, run.Path("/o"), 4, "smol")
    assert cmd[cmd.index("--users") + 1] == "4" and cmd[cmd.index("--generator") + 1] == "smol"
    assert cmd[-1] == "--generation-only"
    plain = run.locust_command(run.parse_args(["--host", "h"]), run.Path("/o"), 8, None)
    assert plain[plain.index("--generator") + 1] == "none" and "--generation-only" not in plain


def test_generation_only_against_a_service_without_a_generator_exits_2_before_any_call(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "check_ready", lambda host, timeout: None)
    monkeypatch.setattr(run, "served_generator", lambda host, timeout: None)
    monkeypatch.setattr(run, "run_locust", lambda *a: pytest.fail("locust started"))
    assert run.main(["--host", "http://127.0.0.1:1", "--out", str(tmp_path), "--generation", "only"]) == 2
    assert "--generation only: http://127.0.0.1:1 serves no generator" in capsys.readouterr().err


def test_a_service_without_a_generator_serves_none(inproc_client):
    assert generation.served_generator(inproc_client) is None


@pytest.fixture(scope="module")
def gen_client(gen_bundle, encoder, generator):
    """The generated client over an in-process app serving the small generator bundle (default slots)."""
    from fastapi.testclient import TestClient
    from softknn_client import AuthenticatedClient

    from softknn.params import Settings
    from softknn.service.app import create_app
    from tests.harness import wait_ready

    settings = Settings(bundle=gen_bundle, model={"threads": 1})
    with TestClient(create_app(settings, encoder=encoder, generator=generator)) as tc:
        wait_ready(tc, 120)
        yield AuthenticatedClient(base_url=str(tc.base_url), token="none").set_httpx_client(tc)


def test_every_generation_task_gets_its_expected_answer(gen_client):
    """Each generation task three times and every invalid generation field once, verified and recorded
    as the load test does them (no locust here)."""
    import random

    assert generation.served_generator(gen_client) == "smollm2-135m-instruct"
    m = mix.Mix(mix.load_queries(), seed=2, generator="smollm2-135m-instruct", generation_only=True)
    rec = report.Recorder()
    rec.started = 0.0
    pinned, draw = iter(sorted(generation.GEN_INVALID)), random.Random(0).choice
    m.rng.choice = lambda seq: next(pinned) if seq == sorted(generation.GEN_INVALID) else draw(seq)
    for kind in [*sorted(GEN_KINDS) * 3, *["gen_invalid"] * len(generation.GEN_INVALID)]:
        call = m.draw(kind)
        response = call.send(gen_client)
        assert mix.verify(call, response) is None, mix.verify(call, response)
        stats = generation.gen_stats(response)
        assert (stats is None) == kind.startswith("gen_invalid")
        if stats is not None and kind != "generate":
            assert stats.tokens >= 1 and stats.ttft_ms is not None and stats.ttft_ms > 0
        rec.record(call.name, call.method, 1.0, refusal=mix.refusal(call, response), gen=stats)
    rec.stopped = 1.0
    s = rec.summary()
    assert s["expected_refusals_by_type"] == {"404 model_not_found": 1, "422 validation_error": 7}
    assert (s["generation"]["calls"], s["generation"]["streams"]) == (9, 6)
    assert {r["name"] for r in s["by_name"] if "streams" in r} == {
        "/v1/generate [generate_stream]", "/v1/chat/completions [chat_stream]"}


def test_a_full_generation_queue_answers_the_mix_429_with_retry_after(gen_bundle, encoder, generator):
    """One slot, no queue, held by a stream: each generation task gets 429 queue_full with a Retry-After,
    which the load test counts as an expected refusal; once the slot is free, they get their answers."""
    import contextlib

    import httpx
    from softknn_client import AuthenticatedClient

    from softknn.params import Settings
    from softknn.service.app import create_app
    from tests.harness import threaded_server

    settings = Settings(bundle=gen_bundle, model={"threads": 1}, generator={"max_concurrent": 1, "max_queue": 0})
    m = mix.Mix(mix.load_queries(), seed=3, generator="smollm2-135m-instruct", generation_only=True)
    calls = [m.draw(kind) for kind in sorted(GEN_KINDS)]
    with threaded_server(create_app(settings, encoder=encoder, generator=generator)) as live, \
            AuthenticatedClient(base_url=str(live.base_url), token="none") as client:
        with httpx.Client(base_url=str(live.base_url), timeout=60) as holder, contextlib.ExitStack() as stack:
            r = stack.enter_context(holder.stream("POST", "/v1/generate", json={
                "prompt": "How much is an adult single on the Amber Line?", "max_tokens": 200, "stream": True}))
            lines = r.iter_lines()  # kept: an iterator closed early would close the stream
            while not next(lines).startswith("data: "):  # its first token: it holds the one slot
                pass
            for call in calls:
                response = call.send(client)
                assert int(response.status_code) == 429 and mix.verify(call, response) is None
                assert mix.refusal(call, response) == "429 queue_full" and mix.retry_after_s(response) == 1
        for call in calls:  # the holder is gone: its slot frees at its next token
            for _ in range(100):
                response = call.send(client)
                if int(response.status_code) != 429:
                    break
                time.sleep(0.1)
            assert int(response.status_code) == 200 and mix.verify(call, response) is None
