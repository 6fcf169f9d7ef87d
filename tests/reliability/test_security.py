"""Security properties of the service and the bundle loader (threat model in docs/security.md).

  * bearer keys are compared with hmac.compare_digest (constant time), for every route that checks one
  * neither key reaches a log record, at DEBUG, through successes and every kind of failure
  * every /v1/admin route refuses the plain API key (403) and a missing or wrong token (401)
  * CORS is off by default (no CORS header, preflight refused) and on for the configured origins only
  * a bundle with a planted pickle is refused with BundleError and the pickle never runs, also when
    its checksums were recomputed to match (a checksum is not a signature)
"""

from __future__ import annotations

import builtins
import hmac
import json
import logging
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import softknn.service.auth
from softknn.common.errors import BundleError
from softknn.service.app import create_app
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import DATA_FILES, MANIFEST, sha256_file, verify_bundle, version_id
from tests.harness import ADMIN_TOKEN, API_KEY
from tests.reliability.conftest import bearer, settings_for


def ready(client: TestClient) -> TestClient:
    deadline = time.monotonic() + 60
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.05)
    return client


@pytest.fixture(scope="module")
def secured(encoder, small_bundle):
    with TestClient(create_app(settings_for(small_bundle), encoder=encoder)) as c:
        yield ready(c)


def admin_routes(app) -> list[tuple[str, str]]:
    """(METHOD, path) of every admin operation, from the app's own OpenAPI document."""
    return [(m.upper(), path) for path, ops in app.openapi()["paths"].items() if path.startswith("/v1/admin")
            for m in sorted(ops)]


# --- keys -------------------------------------------------------------------------------------
def test_every_key_check_goes_through_compare_digest(secured, small_bundle, monkeypatch):
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(softknn.service.auth.hmac, "compare_digest", spy)
    secured.post("/v1/infer", json={"inputs": ["hi"]}, headers=bearer("wrong-key"))
    secured.get("/v1/index", headers=bearer(API_KEY))
    secured.post("/v1/admin/reload", json={"bundle": str(small_bundle)}, headers=bearer("wrong-token"))
    secured.post("/v1/admin/reload", json={"bundle": str(small_bundle)}, headers=bearer(ADMIN_TOKEN))
    secrets = {API_KEY.encode(), ADMIN_TOKEN.encode()}
    assert {b for _, b in calls} == secrets  # both secrets, and only through compare_digest
    assert {a for a, _ in calls} == {b"wrong-key", API_KEY.encode(), b"wrong-token", ADMIN_TOKEN.encode()}


def test_keys_never_reach_a_log_record(secured, small_bundle, caplog):
    attempts = [
        ("POST", "/v1/infer", {"inputs": ["hi"]}, bearer(API_KEY)),
        ("POST", "/v1/infer", {"inputs": ["hi"]}, bearer(ADMIN_TOKEN)),
        ("POST", "/v1/infer", {"inputs": ["hi"]}, bearer(API_KEY + "x")),
        ("POST", "/v1/infer", {"inputs": ["hi"]}, bearer(API_KEY[:-1])),
        ("POST", "/v1/infer", {"inputs": ["hi"]}, {"Authorization": f"Basic {API_KEY}"}),
        ("POST", "/v1/infer", {"inputs": ["hi"]}, {"Authorization": API_KEY}),
        ("POST", "/v1/infer", {"inputs": [""], "k": 0}, bearer(API_KEY)),  # a 422 with the key valid
        ("GET", "/v1/entries/nope", None, bearer(API_KEY)),  # a 404
        ("POST", "/v1/admin/reload", {"bundle": str(small_bundle)}, bearer(API_KEY)),  # 403
        ("POST", "/v1/admin/reload", {"bundle": "/nowhere"}, bearer(ADMIN_TOKEN)),  # 422
        ("POST", "/v1/admin/reload", {"bundle": str(small_bundle)}, bearer(ADMIN_TOKEN)),  # 200
    ]
    with caplog.at_level(logging.DEBUG):
        statuses = [secured.request(m, p, json=b, headers=h).status_code for m, p, b, h in attempts]
    assert statuses == [200, 200, 401, 401, 401, 401, 422, 404, 403, 422, 200]
    text = caplog.text + "\n".join(str(vars(r)) for r in caplog.records)
    for secret in (API_KEY, ADMIN_TOKEN, API_KEY[:-1]):
        assert secret not in text
    assert sum(getattr(r, "status", None) is not None for r in caplog.records) >= len(attempts)  # access log ran


def test_every_admin_route_refuses_the_api_key_and_strangers(secured):
    routes = admin_routes(secured.app)
    assert routes == [("POST", "/v1/admin/reload"), ("POST", "/v1/admin/compact")]  # a new admin route lands here and is checked below
    for method, path in routes:
        r = secured.request(method, path, json={}, headers=bearer(API_KEY))
        assert (r.status_code, r.json()["error"]["type"]) == (403, "forbidden"), path
        for headers in ({}, bearer("guess"), bearer(ADMIN_TOKEN.upper())):
            r = secured.request(method, path, json={}, headers=headers)
            assert (r.status_code, r.json()["error"]["type"]) == (401, "unauthorized"), (path, headers)


def test_no_admin_token_means_no_admin_routes(encoder, small_bundle):
    settings = settings_for(small_bundle, auth={"admin_token": None})
    with TestClient(create_app(settings, encoder=encoder)) as c:
        ready(c)
        for token in (API_KEY, ADMIN_TOKEN, ""):
            r = c.post("/v1/admin/reload", json={"bundle": str(small_bundle)}, headers=bearer(token))
            assert r.status_code == 403


# --- CORS -------------------------------------------------------------------------------------
def preflight(client: TestClient, origin: str):
    return client.options("/v1/infer", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                "Access-Control-Request-Headers": "authorization,content-type"})


def test_cors_is_off_by_default(secured):
    assert secured.app.state.settings.cors_origins == []
    r = preflight(secured, "https://evil.example")
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    r = secured.post("/v1/infer", json={"inputs": ["hi"]}, headers={**bearer(API_KEY), "Origin": "https://evil.example"})
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)


def test_cors_allows_the_configured_origins_only(encoder, small_bundle):
    settings = settings_for(small_bundle, cors_origins=["https://app.example"])
    with TestClient(create_app(settings, encoder=encoder)) as c:
        ready(c)
        ok = preflight(c, "https://app.example")
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in ok.headers  # bearer keys, never cookies
        bad = preflight(c, "https://evil.example")
        assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
        r = c.post("/v1/infer", json={"inputs": ["hi"]}, headers={**bearer(API_KEY), "Origin": "https://app.example"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "retry-after" in r.headers["access-control-expose-headers"].lower()


# --- bundles never unpickle -------------------------------------------------------------------
class Payload:
    """Unpickling this runs exec(...), which writes `marker`: proof that a pickle was executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').write('pickle ran')",)


def plant_pickle(src: Path, dst: Path, name: str, marker: Path) -> Path:
    """A copy of `src` whose `name` is an object array (a pickle), checksums and version_id recomputed
    so that the bundle verifies: what someone with write access to the bundle folder could do."""
    shutil.copytree(src, dst)
    np.save(dst / name, np.array([Payload(marker), 1], dtype=object), allow_pickle=True)
    m = json.loads((dst / MANIFEST).read_text())
    m["files"][name] = {"sha256": sha256_file(dst / name), "bytes": (dst / name).stat().st_size}
    m["version_id"] = version_id(m)
    (dst / MANIFEST).write_text(json.dumps(m, indent=2, sort_keys=True))
    return dst


NPY_FILES = [n for n in DATA_FILES if n.endswith(".npy")]


@pytest.mark.parametrize("name", NPY_FILES)
def test_a_planted_pickle_is_refused_and_never_runs(tmp_path, small_bundle, encoder, name):
    marker = tmp_path / "pwned"
    bad = plant_pickle(small_bundle, tmp_path / "planted", name, marker)
    verify_bundle(bad)  # the checksums match: only the loader stands between the pickle and exec
    with pytest.raises(ValueError, match="allow_pickle=False"):  # numpy's own guard, as the loader calls it
        np.load(bad / name, allow_pickle=False)
    with pytest.raises(BundleError, match=rf"{name}: not a plain numeric array .*never holds pickled objects"):
        load_bundle(bad, expected_fingerprint=encoder.info.fingerprint)
    assert not marker.exists()


def test_reloading_a_planted_bundle_is_422_and_the_old_one_keeps_serving(secured, tmp_path, small_bundle):
    marker = tmp_path / "pwned"
    bad = plant_pickle(small_bundle, tmp_path / "planted", "mem_hidden.npy", marker)  # the default memory's file
    before = secured.get("/readyz").json()["bundle_version"]
    r = secured.post("/v1/admin/reload", json={"bundle": str(bad)}, headers=bearer(ADMIN_TOKEN))
    assert (r.status_code, r.json()["error"]["type"], r.json()["error"]["field"]) == (422, "bundle_error", "bundle")
    assert "never holds pickled objects" in r.json()["error"]["message"]
    assert secured.get("/readyz").json()["bundle_version"] == before
    assert secured.post("/v1/infer", json={"inputs": ["dogs?"]}, headers=bearer(API_KEY)).status_code == 200
    assert not marker.exists()


def test_the_loader_source_never_unpickles():
    """A cheap guard beside the behavioural tests: no pickle/torch.load/eval on any load path."""
    root = Path(__file__).resolve().parents[2]
    banned = re.compile(r"import pickle|allow_pickle=True|torch\.load\(|pickle\.loads?\(|(?<![\w.])eval\(|"
                        r"(?<![\w.])exec\(|yaml\.load\(|trust_remote_code=True")
    files = sorted((root / "softknn").rglob("*.py"))  # the core and every app (softknn/service/, ...)
    assert any(f.parent.name == "service" for f in files) and any(f.parent.name == "index_builder" for f in files)
    for f in files:
        found = banned.search(f.read_text())
        assert found is None, f"{f}: {found and found.group()}"
