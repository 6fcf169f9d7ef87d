"""The generated client (clients/python) against the real app: typed models in and out, the one
error shape, the load test's whole request mix; and, slow, from a fresh venv against `softknn serve`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.deploy.conftest import REPO, serve

SNIPPET_URL = "http://127.0.0.1:8000"


def test_client_infers_with_typed_models(inproc_client):
    from softknn_client.api.index import index
    from softknn_client.api.inference import infer
    from softknn_client.models import IndexResponse, InferRequest, InferResponse

    body = InferRequest(inputs=["Can I bring my bicycle on the ferry?", "Is the cafe open?"], evidence=2, k=4)
    r = infer.sync_detailed(client=inproc_client, body=body)
    assert r.status_code == 200
    assert isinstance(r.parsed, InferResponse)
    assert len(r.parsed.results) == 2
    first = r.parsed.results[0]
    assert len(first.embedding) == 384
    assert len(first.evidence) == 2 and first.evidence[0].rank == 0
    assert first.diagnostics.k == 4 and first.diagnostics.mixing == "fixed"
    assert first.prediction == "vehicles_on_board"
    summary = index.sync(client=inproc_client)
    assert isinstance(summary, IndexResponse)
    assert summary.index.version_id == r.parsed.bundle_version


def test_client_parses_the_error_shape(inproc_client):
    from softknn_client.api.index import entry
    from softknn_client.api.inference import infer
    from softknn_client.models import ErrorResponse, InferRequest

    r = infer.sync_detailed(client=inproc_client, body=InferRequest(inputs=["hi"], k=0))
    assert r.status_code == 422
    assert isinstance(r.parsed, ErrorResponse)
    assert (r.parsed.error.type_, r.parsed.error.field) == ("validation_error", "k")
    r = entry.sync_detailed("handbook/no such.md#0", client=inproc_client)
    assert r.status_code == 404
    assert isinstance(r.parsed, ErrorResponse) and r.parsed.error.type_ == "not_found"


def test_every_call_of_the_load_mix_gets_its_expected_answer(inproc_client):
    """Each task of loadtest.mix once, and every deliberately invalid request once, verified as the
    load test verifies them (no locust here)."""
    from loadtest import mix
    from loadtest.generation import served_defaults

    defaults = served_defaults(inproc_client)
    assert (defaults["evidence"], defaults["mixing"]) == (5, "fixed")  # the settings' defaults (the fixture sets none)
    m = mix.Mix(mix.load_queries(), seed=1, defaults=defaults)
    calls = []

    def send(kind: str) -> None:
        call = m.draw(kind)
        calls.append(call.kind)
        problem = mix.verify(call, call.send(inproc_client))
        assert problem is None, problem

    for kind in [k for k in mix.WEIGHTS if k not in ("invalid", "entry")] + ["entry"]:  # entry: a seen chunk id
        send(kind)
    pinned = iter(sorted(mix.INVALID))
    m.rng.choice = lambda seq: next(pinned)  # each invalid kind once (only _invalid draws from here on)
    for _ in mix.INVALID:
        send("invalid")
    assert "entry" in calls and {k for k in calls if k.startswith("invalid:")} == {f"invalid:{w}" for w in mix.INVALID}


def snippet() -> str:
    """The first ```python block of docs/client.md."""
    text = (REPO / "docs" / "client.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code, "docs/client.md has no ```python block"
    assert SNIPPET_URL in code.group(1)
    return code.group(1)


@pytest.mark.slow
def test_snippet_runs_from_a_fresh_venv_against_softknn_serve(tmp_path, sample_bundle_path):
    """`pip install clients/python` alone into a new venv (no softknn, no torch), then the README's
    snippet against a live `softknn serve` on the sample bundle."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO / "clients/python")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([py, "-c", "import softknn_client, importlib.util as u; "
                        "print([m for m in ('softknn', 'torch', 'fastapi') if u.find_spec(m)])"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr  # the client alone, not the service's stack
    with serve(sample_bundle_path, tmp_path / "server.log") as url:
        code = snippet().replace(SNIPPET_URL, url)
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"vehicles_on_board \[\('faq-\d{4}', 0\.\d+\), \('faq-\d{4}', 0\.\d+\)\]\n", r.stdout), r.stdout
