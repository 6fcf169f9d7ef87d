"""The load test's parts that need no locust: the request mix, the summary arithmetic, the verdict."""

from __future__ import annotations

import csv
import json
import math

import pytest
from loadtest import mix, report, run


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
