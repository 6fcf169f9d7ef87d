"""The command line answers what HTTP answers: the same question on the same bundle, with the same
settings, through `softknn query --json` and POST /v1/infer, and through `softknn generate --json` and
POST /v1/generate, compared field by field. Both doors fill what they leave unset in the one step
(softknn.params.infer_params, gen_params), and say where each value came from (diagnostics.sources)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from softknn.cli import app as cli
from softknn.service.app import create_app
from tests.harness import wait_ready
from tests.numerics import assert_tree_close
from tests.service.conftest import settings_for

TOL = 1e-5
TEXTS = ["Can I bring my dog on the ferry?", "How much is an adult single on the Amber Line?"]
QUESTION = "How much is an adult single on the Amber Line?"


def _cli(args: list[str]) -> dict:
    r = CliRunner().invoke(cli, args, prog_name="softknn")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("options, body", [
    ([], {}),  # every parameter unset: the settings', the bundle's, the table's
    (["--k", "6", "--retrieval", "dense", "--mixing", "joint", "--spans", "2"],
     {"k": 6, "retrieval": "dense", "mixing": "joint", "spans": 2}),
    (["--exact", "--knn-temperature", "0.07", "--filter", '{"field": "label", "in": ["pets_and_animals"]}'],
     {"exact": True, "knn_temperature": 0.07, "filter": {"field": "label", "in": ["pets_and_animals"]}}),
])
def test_softknn_query_answers_what_v1_infer_answers(options, body, bundle_dir, encoder, running_app, monkeypatch):
    monkeypatch.setenv("SOFTKNN_DEFAULTS__EVIDENCE", "3")  # a setting both doors read
    monkeypatch.setattr("softknn.cli._encoder", lambda settings: encoder)
    got = _cli(["query", str(bundle_dir), *TEXTS, "--json", *options])
    with running_app(settings_for(bundle_dir, defaults={"evidence": 3})) as client:
        r = client.post("/v1/infer", json={"inputs": TEXTS, **body})
    assert r.status_code == 200, r.text
    want = r.json()
    assert {k: got[k] for k in ("bundle_version", "model", "model_fingerprint")} == {
        k: want[k] for k in ("bundle_version", "model", "model_fingerprint")}
    assert_tree_close(got["results"], want["results"], TOL)  # every field of every result, evidence and diagnostics
    src = want["results"][0]["diagnostics"]["sources"]
    assert src["evidence"] == "settings" and len(want["results"][0]["evidence"]) == 3
    assert all(src[name] == "request" for name in body)
    assert src["lexical_weight"] in ("bundle", "default") and src["alpha"] == "default"


@pytest.fixture(scope="module")
def gen_client(gen_bundle, encoder, generator):
    settings = settings_for(gen_bundle, generate={"evidence": 2})
    with TestClient(create_app(settings, encoder=encoder, generator=generator)) as c:
        wait_ready(c, 120)
        yield c


@pytest.mark.parametrize("options, body", [
    ([], {}),  # k and β from the bundle (its calibration, else the fixed ones), evidence from the settings
    (["--k", "2", "--prior", "1.0", "--spans", "2", "--no-refuse"], {"k": 2, "prior": 1.0, "spans": 2, "refuse": False}),
    (["--mixing", "fixed", "--alpha", "0.5", "--retrieval", "dense"], {"mixing": "fixed", "alpha": 0.5, "retrieval": "dense"}),
])
def test_softknn_generate_answers_what_v1_generate_answers(options, body, gen_bundle, gen_client, encoder, generator,
                                                           monkeypatch):
    monkeypatch.setenv("SOFTKNN_GENERATE__EVIDENCE", "2")
    monkeypatch.setattr("softknn.cli._encoder", lambda settings: encoder)
    monkeypatch.setattr("softknn.generate.serving.Generator.load", lambda name, **kw: generator)
    got = _cli(["generate", str(gen_bundle), QUESTION, "--json", "--max-tokens", "8", *options])
    r = gen_client.post("/v1/generate", json={"prompt": QUESTION, "max_tokens": 8, **body})
    assert r.status_code == 200, r.text
    want = r.json()
    assert want.pop("request_id")
    assert sorted(got) == sorted(want)
    assert_tree_close(got, want, TOL)  # text, tokens, evidence, diagnostics (k, β, runtime, sources), usage
    d = want["diagnostics"]
    assert d["sources"]["evidence"] == "settings" and len(want["evidence"]) <= 2
    assert d["sources"]["k"] == ("request" if "k" in body else "bundle" if d["defaults"] == "calibrated" else "default")
    assert d["k"] == body.get("k", d["k"]) and [e["rank"] for e in want["evidence"]] == list(range(len(want["evidence"])))
