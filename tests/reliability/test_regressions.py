"""Regression tests for the bugs the reliability work found, each named for what it broke.

Found by the schemathesis run (tests/reliability/test_fuzz.py):
  * a blank text was schema-valid but refused (422): the schema now says `pattern: \\S`
  * `"evidence": 1.0` was refused although JSON Schema's integer includes it
  * POST /v1/admin/reload answered 400 (malformed JSON) and 413 without documenting them
Found by the hostile inputs (tests/reliability/test_hostile.py):
  * invalid UTF-8, deep nesting, a 5,000-digit integer: 400 "bad_request" with a generic message,
    where every other unparsable body is "malformed_json" with the reason
  * a slow body held its connection and request open for ever (uvicorn has no body timeout): 408
    (tested in test_hostile.py, over a real socket)
Found by the crash-build test (tests/reliability/test_crash_build.py): see the builder tests there.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from softknn.service.app import create_app
from tests.harness import ADMIN_TOKEN
from tests.reliability.conftest import bearer, settings_for


@pytest.fixture(scope="module")
def client(encoder, small_bundle):
    with TestClient(create_app(settings_for(small_bundle), encoder=encoder)) as c:
        c.headers.update(bearer(c.app.state.settings.auth.api_key.get_secret_value()))
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "not ready within 60 s"
            time.sleep(0.05)
        yield c


def test_openapi_says_a_text_needs_a_non_whitespace_character(client):
    doc = client.get("/openapi.json").json()
    items = doc["components"]["schemas"]["InferRequest"]["properties"]["inputs"]["items"]
    assert items == {"type": "string", "pattern": "\\S"}
    r = client.post("/v1/infer", json={"inputs": ["\u2003\t"]})  # em space and tab: blank
    assert (r.status_code, r.json()["error"]["field"]) == (422, "inputs[0]")


@pytest.mark.parametrize("field,value,seen", [("k", 4.0, ("diagnostics", "k", 4)), ("evidence", 1.0, ("evidence", 1)),
                                              ("spans", 0.0, None)])
def test_integral_floats_are_integers(client, field, value, seen):
    r = client.post("/v1/infer", json={"inputs": ["can my dog come?"], field: value})
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    if seen and seen[0] == "diagnostics":
        assert res["diagnostics"][seen[1]] == seen[2]
    elif seen:
        assert len(res["evidence"]) == seen[1]


@pytest.mark.parametrize("raw", ['{"inputs": ["a"], "k": 4.5}', '{"inputs": ["a"], "k": 1e400}',
                                 '{"inputs": ["a"], "k": NaN}', '{"inputs": ["a"], "k": true}'])
def test_non_integral_numbers_are_still_refused(client, raw):
    r = client.post("/v1/infer", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "k"


def test_reload_documents_every_status_it_answers(client):
    responses = client.get("/openapi.json").json()["paths"]["/v1/admin/reload"]["post"]["responses"]
    assert {"400", "413"} <= set(responses)
    r = client.post("/v1/admin/reload", content=b"\x00", headers={**bearer(ADMIN_TOKEN),
                                                                  "content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["type"]) == (400, "malformed_json")


@pytest.mark.parametrize("raw,reason", [
    (b'{"inputs": ["\xc3\x28"]}', "not UTF-8 (invalid continuation byte at byte 13)"),
    (b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
])
def test_unparsable_bodies_are_malformed_json_with_the_reason(client, raw, reason):
    r = client.post("/v1/infer", content=raw, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (400, {"error": {"type": "malformed_json", "field": None,
                                                         "message": f"request body is not valid JSON: {reason}"}})


# The slow body (408 and the connection closed) needs a real socket: see
# tests/reliability/test_hostile.py::test_slow_body_gets_408_at_the_deadline_and_the_connection_is_closed.
