"""softknn.params.PARAMS is the one declaration of the retrieval and mixing parameters: the settings,
the request schemas and the CLI are built from it; τ is `knn_temperature` everywhere, `temperature`
its deprecated alias in /v1/infer, /v1/embeddings and the CLI (issue 37 item 2)."""

from __future__ import annotations

import json

import pytest

from softknn.params import PARAMS, InferDefaults, Settings

# JSON Schema's names of the table's bounds
BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _bounds(prop: dict) -> dict[str, float]:
    """A property's numeric bounds, from it or from its non-null anyOf branch."""
    for branch in [prop, *prop.get("anyOf", [])]:
        found = {k: branch[v] for k, v in BOUNDS.items() if v in branch}
        found |= {k: branch[k] for k in BOUNDS if k in branch}  # an Annotated int in a union keeps pydantic's names
        if found:
            return found
    return {}


def _schemas(settings: Settings) -> dict[str, dict]:
    from softknn.service.schemas.embeddings import embedding_request_model
    from softknn.service.schemas.generate import generate_request_model
    from softknn.service.schemas.infer import infer_request_model
    from softknn.service.schemas.rerank import rerank_request_model

    emb = embedding_request_model(settings).model_json_schema()
    return {"infer": infer_request_model(settings).model_json_schema()["properties"],
            "embeddings": emb["$defs"]["EmbeddingOptions"]["properties"],
            "rerank": rerank_request_model(settings).model_json_schema()["properties"],
            "generate": generate_request_model(settings).model_json_schema()["properties"]}


def test_every_param_is_a_setting_with_the_tables_default_bounds_and_description():
    import dataclasses

    from softknn.infer.engine import InferParams
    from softknn.retrieval.search import SETTING_ATTRS

    assert {n for n, p in PARAMS.items() if p.setting} == set(InferDefaults.model_fields)
    defaults = InferDefaults()
    props = InferDefaults.model_json_schema()["properties"]
    attrs = {f.name: f.default for f in dataclasses.fields(InferParams)}
    for name, p in PARAMS.items():
        assert attrs[SETTING_ATTRS.get(name, name)] == p.default, name  # InferParams' own defaults agree
        if not p.setting:
            continue
        assert getattr(defaults, name) == p.default, name
        assert _bounds(props[name]) == p.bounds(), name
        assert props[name]["description"] == p.description, name


def test_the_request_schemas_take_their_bounds_and_defaults_from_the_table():
    settings = Settings()
    lim = settings.limits
    # where a request's bound is the service's limit rather than the table's
    limit = {"k": {"le": lim.max_k}, "evidence": {"le": lim.max_evidence}}
    seen = 0
    for route, props in _schemas(settings).items():
        for name, p in PARAMS.items():
            if name not in props:
                continue
            seen += 1
            assert _bounds(props[name]) == {**p.bounds(), **limit.get(name, {})}, (route, name)
            if route in ("infer", "embeddings"):
                want = min(p.default, lim.max_evidence) if name == "evidence" else p.default
                assert props[name].get("default") == want, (route, name)
    assert seen >= 25
    for route in ("infer", "embeddings"):  # the deprecated name has τ's bounds and says it is deprecated
        tau = _schemas(settings)[route]["temperature"]
        assert tau["deprecated"] is True and "deprecated: use knn_temperature" in tau["description"]
        assert _bounds(tau) == PARAMS["knn_temperature"].bounds()


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
