"""openapi.json (committed) is exactly what the app serves; clients/python is exactly what it generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from scripts import export_openapi

from tests.deploy.conftest import REPO

FIX = "run `bash scripts/gen_client.sh` (exports openapi.json, regenerates clients/python) and commit both"


def test_committed_openapi_matches_the_app():
    committed = (REPO / "openapi.json").read_text(encoding="utf-8")
    assert committed == export_openapi.spec_text(), f"openapi.json drifted from the app: {FIX}"


def test_export_ignores_the_environment_and_is_canonical(monkeypatch):
    text = export_openapi.spec_text()
    monkeypatch.setenv("SOFTKNN_LIMITS__MAX_K", "3")
    monkeypatch.setenv("SOFTKNN_DEFAULTS__ALPHA", "0.25")
    assert export_openapi.spec_text() == text
    spec = json.loads(text)
    assert text == json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    body = spec["components"]["schemas"]["InferRequest"]["properties"]
    # one static schema: a server's limits and settings are said at their defaults, never the env's
    assert "limits.max_k (256 by default)" in body["k"]["description"] and "default" not in body["alpha"]
    assert "left out: the server's setting, 0.7 by default" in body["alpha"]["description"]


def test_operation_ids_are_the_route_names():
    """The client's module names (softknn_client.api.<tag>.<operationId>): unique, and changed only on purpose."""
    spec = json.loads(export_openapi.spec_text())
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), f"duplicate operation ids (route names): {sorted(ids)}"
    assert sorted(ids) == ["chat_completions", "compact", "delete_document", "embeddings", "entry", "generate",
                          "get_document", "healthz", "index", "infer", "list_kbs", "metrics", "models", "put_document", "readyz",
                          "reload", "rerank"]


def test_app_serves_the_exported_document(inproc_app):
    assert inproc_app.get("/openapi.json").json() == json.loads(export_openapi.spec_text())


def test_check_mode_fails_on_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "openapi.json"
    stale.write_text(export_openapi.spec_text().replace('"title": "softknn"', '"title": "stale"'))
    assert export_openapi.main(["--check", "--out", str(stale)]) == 1
    assert "is stale" in capsys.readouterr().err
    stale.write_text(export_openapi.spec_text())
    assert export_openapi.main(["--check", "--out", str(stale)]) == 0


def test_committed_client_matches_the_generator():
    """Regenerates the client from openapi.json into a temp dir (pinned openapi-python-client and ruff,
    in their own cached venv; offline once that exists) and diffs it with clients/python."""
    r = subprocess.run(["bash", "scripts/gen_client.sh", "--check"], cwd=REPO, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr[-6000:]}\n{FIX}"
    assert "clients/python matches openapi.json" in r.stdout
