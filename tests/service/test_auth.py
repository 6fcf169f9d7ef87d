"""Bearer auth on and off, in process and over real HTTP; probes and metrics stay open."""

from __future__ import annotations

import logging

import pytest

KEY, ADMIN_TOKEN = "k-live-0123456789", "adm-9876543210"


def err(status_kind: str, message: str) -> dict:
    return {"error": {"type": status_kind, "message": message, "field": None}}


MISSING_KEY = err("unauthorized", "missing bearer token: send 'Authorization: Bearer <api key>'")
BAD_KEY = err("unauthorized", "invalid API key")


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured(running_app, make_settings):
    settings = make_settings(auth={"api_key": KEY, "admin_token": ADMIN_TOKEN})
    with running_app(settings) as client:
        yield client


def test_auth_off_leaves_v1_open_and_admin_needs_its_token(inproc, bundle_dir, admin_headers):
    assert inproc.post("/v1/infer", json={"inputs": ["open?"]}).status_code == 200
    assert inproc.get("/v1/index").status_code == 200
    r = inproc.post("/v1/admin/reload", json={"bundle": str(bundle_dir)})
    assert (r.status_code, r.json()) == (401, err("unauthorized",
                                                  "missing bearer token: send 'Authorization: Bearer <admin token>'"))
    r = inproc.post("/v1/admin/reload", json={"bundle": str(bundle_dir)}, headers=admin_headers)
    assert r.status_code == 200


def test_admin_routes_are_off_without_an_admin_token(running_app, make_settings, bundle_dir):
    with running_app(make_settings(auth={"admin_token": None})) as client:
        r = client.post("/v1/admin/reload", json={"bundle": str(bundle_dir)}, headers=bearer("anything"))
        assert (r.status_code, r.json()) == (403, err(
            "forbidden", "admin routes are disabled: no admin token is configured (SOFTKNN_AUTH__ADMIN_TOKEN)"))


@pytest.mark.parametrize("headers,status,payload", [
    ({}, 401, MISSING_KEY),
    (bearer("wrong"), 401, BAD_KEY),
    ({"Authorization": f"Basic {KEY}"}, 401, MISSING_KEY),
    ({"Authorization": KEY}, 401, MISSING_KEY),
    (bearer(KEY + "x"), 401, BAD_KEY),
])
def test_auth_on_refuses_missing_or_wrong_keys(secured, headers, status, payload):
    for method, path, body in [("POST", "/v1/infer", {"inputs": ["hi"]}), ("GET", "/v1/index", None),
                               ("GET", "/v1/entries/faq-0001", None)]:
        r = secured.request(method, path, json=body, headers=headers)
        assert (r.status_code, r.json()) == (status, payload), path
        assert r.headers["www-authenticate"].startswith("Bearer")


def test_auth_on_accepts_the_key_and_the_admin_token(secured):
    for token in (KEY, ADMIN_TOKEN):
        assert secured.post("/v1/infer", json={"inputs": ["hi"]}, headers=bearer(token)).status_code == 200
        assert secured.get("/v1/entries/faq-0001", headers=bearer(token)).status_code == 200


def test_the_api_key_does_not_open_admin_routes(secured, bundle_dir):
    body = {"bundle": str(bundle_dir)}
    r = secured.post("/v1/admin/reload", json=body, headers=bearer(KEY))
    assert (r.status_code, r.json()) == (403, err("forbidden", "the API key does not grant admin routes; "
                                                               "use the admin token"))
    r = secured.post("/v1/admin/reload", json=body, headers=bearer("nope"))
    assert (r.status_code, r.json()) == (401, err("unauthorized", "invalid admin token"))
    assert secured.post("/v1/admin/reload", json=body, headers=bearer(ADMIN_TOKEN)).status_code == 200


def test_probes_metrics_docs_and_page_need_no_key(secured):
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/"):
        assert secured.get(path).status_code == 200, path


def test_keys_never_reach_the_logs(secured, caplog):
    with caplog.at_level(logging.DEBUG):
        secured.post("/v1/infer", json={"inputs": ["hi"]}, headers=bearer(KEY))
        secured.post("/v1/infer", json={"inputs": ["hi"]}, headers=bearer("wrong-" + KEY))
    text = caplog.text + " ".join(str(vars(r)) for r in caplog.records)
    assert KEY not in text and ADMIN_TOKEN not in text
    assert any(getattr(r, "status", None) == 401 for r in caplog.records)  # the access log did run


def test_auth_over_real_http(auth_server):
    r = auth_server.post("/v1/infer", json={"inputs": ["hi"]})
    assert (r.status_code, r.json()) == (401, MISSING_KEY)
    r = auth_server.post("/v1/infer", json={"inputs": ["hi"]}, headers=bearer(auth_server.api_key))
    assert r.status_code == 200
    r = auth_server.get("/v1/index", headers=bearer(auth_server.api_key))
    assert r.status_code == 200
    assert auth_server.get("/readyz").status_code == 200
    r = auth_server.post("/v1/admin/reload", json={"bundle": "/nowhere"}, headers=bearer(auth_server.api_key))
    assert r.status_code == 403
