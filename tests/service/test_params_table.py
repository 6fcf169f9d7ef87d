"""The parameter table (softknn.common.table) is the one declaration of every request parameter: the
settings, the request schemas and the CLI are derived from it; τ is `knn_temperature` everywhere,
`temperature` its deprecated alias in /v1/infer, /v1/embeddings and the CLI."""

from __future__ import annotations

import json

import pytest

from softknn.common.table import GenParams, InferParams, entries
from softknn.params import Settings

# JSON Schema's names of the table's bounds
BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _bounds(prop: dict) -> dict[str, float]:
    """A property's numeric bounds, from it or from its non-null anyOf branch."""
    for branch in [prop, *prop.get("anyOf", [])]:
        found = {k: branch[v] for k, v in BOUNDS.items() if v in branch}
        if found:
            return found
    return {}


def _schemas() -> dict[str, tuple[type, dict]]:
    from softknn.service.schemas import ChatRequest, EmbeddingRequest, GenerateRequest, InferRequest, RerankRequest

    emb = EmbeddingRequest.model_json_schema()
    return {"infer": (InferParams, InferRequest.model_json_schema()["properties"]),
            "embeddings": (InferParams, emb["$defs"]["EmbeddingOptions"]["properties"]),
            "rerank": (InferParams, RerankRequest.model_json_schema()["properties"]),
            "generate": (GenParams, GenerateRequest.model_json_schema()["properties"]),
            "chat": (GenParams, ChatRequest.model_json_schema()["properties"])}


def test_every_request_field_of_a_parameter_is_the_tables_unset_by_default():
    seen = 0
    for route, (cls, props) in _schemas().items():
        for e in entries(cls):
            if e.name not in props:
                continue
            seen += 1
            prop = props[e.name]
            assert "default" not in prop, (route, e.name)  # left out: the settings, then the bundle decide
            assert ("anyOf" in prop) == (e.optional or e.name in ("stop", "max_tokens") and route == "chat"
                                         or e.name == "stop"), (route, e.name)  # null only where it means unset
            assert _bounds(prop) == e.param.bounds(), (route, e.name)
            assert prop["description"].startswith(e.param.description) or route == "rerank", (route, e.name)
            if e.param.limit:  # a server's limit: said, not in the static schema
                assert f"at most the server's {e.param.limit}" in prop["description"], (route, e.name)
            if e.choices:
                branch = next(b for b in prop.get("anyOf", [prop]) if b.get("type") != "null")
                assert tuple(branch["enum"]) == e.choices, (route, e.name)
    assert seen >= 45
    for route in ("infer", "embeddings"):  # the deprecated name has τ's bounds and says it is deprecated
        tau = _schemas()[route][1]["temperature"]
        assert tau["deprecated"] is True and "deprecated: use knn_temperature" in tau["description"]
        assert _bounds(tau) == next(e for e in entries(InferParams) if e.name == "knn_temperature").param.bounds()


def test_a_limit_of_the_serving_app_is_checked_against_its_own_settings(running_app, make_settings):
    with running_app(make_settings(limits={"max_k": 3, "max_evidence": 2}, defaults={"k": 2, "evidence": 1})) as client:
        r = client.post("/v1/infer", json={"inputs": ["dogs?"], "k": 4})
        assert r.status_code == 422 and r.json()["error"]["field"] == "k" and "3" in r.json()["error"]["message"]
        r = client.post("/v1/infer", json={"inputs": ["dogs?"], "evidence": 3})
        assert r.status_code == 422 and r.json()["error"]["field"] == "evidence"
        assert client.post("/v1/infer", json={"inputs": ["dogs?"], "k": 3, "evidence": 2}).status_code == 200


def test_the_old_env_var_name_of_tau_is_still_read(monkeypatch):
    monkeypatch.setenv("SOFTKNN_DEFAULTS__TEMPERATURE", "0.3")
    assert Settings().defaults.knn_temperature == 0.3
    monkeypatch.delenv("SOFTKNN_DEFAULTS__TEMPERATURE")
    monkeypatch.setenv("SOFTKNN_DEFAULTS__KNN_TEMPERATURE", "0.4")
    assert Settings().defaults.knn_temperature == 0.4


def test_the_openapi_document_marks_temperature_deprecated(inproc):
    doc = inproc.get("/openapi.json").json()["components"]["schemas"]
    for schema in ("InferRequest", "EmbeddingOptions"):
        props = doc[schema]["properties"]
        assert props["temperature"]["deprecated"] is True, schema
        assert "deprecated" not in props["knn_temperature"], schema
    assert "temperature" in doc["GenerateRequest"]["properties"]  # the sampling temperature there: not deprecated
    assert "deprecated" not in doc["GenerateRequest"]["properties"]["temperature"]


BODY = {"inputs": ["Can I bring my dog on the ferry?"], "exact": True, "k": 5, "retrieval": "dense", "evidence": 3}


def test_temperature_and_knn_temperature_give_the_same_result(inproc):
    old = inproc.post("/v1/infer", json={**BODY, "temperature": 0.07})
    new = inproc.post("/v1/infer", json={**BODY, "knn_temperature": 0.07})
    both = inproc.post("/v1/infer", json={**BODY, "knn_temperature": 0.07, "temperature": 0.07})
    assert old.status_code == new.status_code == both.status_code == 200, (old.text, new.text, both.text)
    a, b, c = (r.json()["results"][0] for r in (old, new, both))
    # the old key is still echoed (deprecated) so clients that read it keep working
    assert a["diagnostics"]["knn_temperature"] == a["diagnostics"]["temperature"] == 0.07
    assert a["embedding"] == b["embedding"] == c["embedding"]
    assert [e["weight"] for e in a["evidence"]] == [e["weight"] for e in b["evidence"]]


def test_temperature_and_knn_temperature_differing_is_a_422(inproc):
    r = inproc.post("/v1/infer", json={**BODY, "knn_temperature": 0.07, "temperature": 0.5})
    assert r.status_code == 422
    e = r.json()["error"]
    assert set(e) == {"type", "message", "field"} and e["field"] == "temperature"
    assert "knn_temperature" in e["message"]
    emb = {"input": "a dog?", "softknn": {"augmented": True, "knn_temperature": 0.07, "temperature": 0.5}}
    r = inproc.post("/v1/embeddings", json=emb)
    assert r.status_code == 422 and r.json()["error"]["field"] == "softknn.temperature"
    emb["softknn"]["temperature"] = 0.07
    assert inproc.post("/v1/embeddings", json=emb).status_code == 200


def test_an_invalid_temperature_names_the_field_sent(inproc):
    r = inproc.post("/v1/infer", json={**BODY, "temperature": 1e-7})
    assert r.status_code == 422 and r.json()["error"]["field"] == "temperature"
    r = inproc.post("/v1/infer", json={**BODY, "knn_temperature": 1e-7})
    assert r.status_code == 422 and r.json()["error"]["field"] == "knn_temperature"


def test_the_cli_takes_temperature_as_a_hidden_alias_of_knn_temperature(sample_bundle_path):
    from typer.testing import CliRunner

    from softknn.cli import app

    args = ["query", str(sample_bundle_path), "Can I bring my dog?", "--json", "--exact", "--k", "3"]
    old = CliRunner().invoke(app, [*args, "--temperature", "0.07"])
    new = CliRunner().invoke(app, [*args, "--knn-temperature", "0.07"])
    assert old.exit_code == new.exit_code == 0, (old.output, new.output)
    a, b = (json.loads(r.stdout)["results"][0] for r in (old, new))
    assert a["diagnostics"]["knn_temperature"] == 0.07
    assert a["embedding"] == pytest.approx(b["embedding"], abs=1e-6)
    both = CliRunner().invoke(app, [*args, "--knn-temperature", "0.07", "--temperature", "0.5"])
    assert both.exit_code != 0 and "--knn-temperature" in both.output
    shown = CliRunner().invoke(app, ["query", "--help"], terminal_width=200).output
    assert "--knn-temperature" in shown and "--temperature " not in shown
