"""The HTTP contract, in process and over real HTTP: fields, exactness, index, entries, health."""

from __future__ import annotations

import json
import logging
import math
import urllib.parse

import numpy as np

from softknn.infer.engine import InferParams
from softknn.service.logs import JsonFormatter
from softknn.service.schemas import EntryResponse, IndexResponse, InferResponse

MAX_K = 512  # tests/service/conftest.py sets limits.max_k to it


def test_infer_response_carries_every_documented_field(api, engine):
    r = api.post("/v1/infer", json={"inputs": ["can I bring my dog on the ferry?", "when does the cafe close?"],
                                    "return_tokens": True, "evidence": 3, "spans": 2},
                 headers={"X-Request-ID": "contract-1"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "contract-1"
    body = r.json()
    InferResponse.model_validate(body)  # every field documented, none missing (extra="forbid")
    info = engine.encoder.info
    assert {k: body[k] for k in ("request_id", "model", "model_fingerprint", "bundle_version")} == {
        "request_id": "contract-1", "model": info.name, "model_fingerprint": info.fingerprint,
        "bundle_version": engine.bundle.version}
    assert len(body["results"]) == 2
    res = body["results"][0]
    assert len(res["embedding"]) == info.dim
    assert math.isclose(float(np.linalg.norm(res["embedding"])), 1.0, abs_tol=1e-5)
    assert len(res["evidence"]) == 3 and [e["rank"] for e in res["evidence"]] == [0, 1, 2]
    assert all(len(e["spans"]) <= 2 for e in res["evidence"])
    d = res["diagnostics"]
    assert (d["k"], d["alpha"], d["mixing"], d["retrieved"], d["search"]) == (8, 0.7, "fixed", 8, "exact")
    assert math.isclose(sum(e["mass_share"] for e in res["evidence"]) + 0.0, sum(
        (1 - 0.7) * e["weight"] for e in res["evidence"]), rel_tol=1e-4)
    assert res["label_scores"] is not None and res["prediction"] == next(iter(res["label_scores"]))
    n = d["n_tokens"]
    assert len(res["tokens"]) == n and len(res["token_embeddings"]) == n
    assert len(res["head_memory_share"]) == info.num_heads and len(res["head_memory_share"][0]) == n


def test_optional_outputs_are_null_unless_asked(api):
    res = api.post("/v1/infer", json={"inputs": ["lost my bag on the ferry"], "evidence": 0}).json()["results"][0]
    assert (res["tokens"], res["token_embeddings"], res["head_memory_share"], res["evidence"]) == (None, None, None, [])


def test_alpha_one_reproduces_the_plain_sentence_transformers_embedding(api, encoder):
    text = "What happens to my ticket if the sailing is cancelled because of a storm?"
    r = api.post("/v1/infer", json={"inputs": [text], "alpha": 1.0})
    assert r.status_code == 200
    got = np.asarray(r.json()["results"][0]["embedding"])
    plain = encoder.st.encode([text], convert_to_numpy=True, normalize_embeddings=True)[0]
    assert np.abs(got - plain).max() <= 1e-5


def test_exact_full_kb_response_equals_the_engine_run_directly(api, engine, assert_same):
    text = "Can I take my bicycle on the morning boat to the island?"
    n = len(engine.bundle)
    body = {"inputs": [text], "exact": True, "k": n, "mixing": "joint", "evidence": 5, "spans": 3}
    r = api.post("/v1/infer", json=body)
    assert r.status_code == 200
    want = engine.infer([text], InferParams(exact=True, k=n, mixing="joint", evidence=5, spans=3))[0]
    got = r.json()["results"][0]
    assert got["diagnostics"]["retrieved"] == n and got["diagnostics"]["truncation_bound"] == 0.0
    assert_same(got, want)


def test_index_summary_names_the_served_bundle(api, engine):
    r = api.get("/v1/index")
    assert r.status_code == 200
    body = IndexResponse.model_validate(r.json())
    assert body.index.model_dump() == engine.bundle.summary()
    assert body.bundle_version == engine.bundle.version


def test_entry_returns_one_chunk_with_provenance_even_with_slashes_in_its_id(api, engine):
    row = next(i for i, c in enumerate(engine.bundle.chunks) if "/" in c["chunk_id"])
    c = engine.bundle.chunks[row]
    r = api.get("/v1/entries/" + urllib.parse.quote(c["chunk_id"], safe="/"))
    assert r.status_code == 200
    entry = EntryResponse.model_validate(r.json()).entry
    assert (entry.row, entry.chunk_id, entry.doc_id, entry.text, entry.start, entry.end) == (
        row, c["chunk_id"], c["doc_id"], c["text"], c["start"], c["end"])
    assert len(entry.token_spans) == int(engine.bundle.kv.count[row])


def test_unknown_entry_is_404_in_the_error_shape(api, engine):
    r = api.get("/v1/entries/no-such-chunk")
    assert r.status_code == 404
    assert r.json() == {"error": {"type": "not_found", "field": "chunk_id",
                                  "message": f"no chunk 'no-such-chunk' in bundle {engine.bundle.version}"}}


def test_health_ready_metrics_and_the_explorer_page(api, engine):
    assert (api.get("/healthz").status_code, api.get("/healthz").json()) == (200, {"status": "ok"})
    r = api.get("/readyz")
    assert (r.status_code, r.json()) == (200, {"status": "ready", "bundle_version": engine.bundle.version,
                                               "model": engine.encoder.info.name})
    api.post("/v1/infer", json={"inputs": ["metrics please"]})
    text = api.get("/metrics").text
    for name in ("softknn_http_requests_total", "softknn_http_request_duration_seconds_bucket",
                 "softknn_queue_depth", "softknn_batch_size_bucket", "softknn_inference_seconds_bucket",
                 "softknn_memory_share_bucket", "softknn_queue_wait_seconds_bucket"):
        assert name in text, name
    assert f'softknn_bundle_info{{chunks="{len(engine.bundle)}",index="flat",kb="default",model="{engine.encoder.info.name}"' in text
    assert f'version_id="{engine.bundle.version}"' in text
    assert 'softknn_http_requests_total{method="POST",route="/v1/infer",status="200"}' in text
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text and "softknn" in page.text and "explorer" in page.text  # the page evolves


def test_openapi_documents_the_limits_and_the_result_fields(api):
    doc = api.get("/openapi.json").json()
    req = doc["components"]["schemas"]["InferRequest"]["properties"]
    # a server's limit is said, not in the static schema (its value is this server's settings'); unset: null
    assert "at most the server's limits.max_k (256 by default)" in req["k"]["description"]
    assert "limits.max_inputs (64 by default)" in req["inputs"]["description"] and req["alpha"].get("default") is None
    result = doc["components"]["schemas"]["InferResult"]["properties"]
    assert {"embedding", "evidence", "diagnostics", "label_scores", "prediction", "abstained", "tokens",
            "token_embeddings", "head_memory_share"} <= set(result)
    assert "influence" in doc["components"]["schemas"]["EvidenceItem"]["properties"]


def test_real_server_answers_503_while_loading_then_ready(server):
    seen = server.ready_statuses
    assert seen[-1] == 200
    assert 503 in seen  # it listened before the model was loaded and said so


def test_request_defaults_come_from_settings(running_app, make_settings):
    settings = make_settings(defaults={"alpha": 0.5, "k": 3, "mixing": "fixed", "evidence": 2, "knn_temperature": 0.1})
    with running_app(settings) as client:
        res = client.post("/v1/infer", json={"inputs": ["is the cafe open?"]}).json()["results"][0]
        d = res["diagnostics"]
        assert (d["alpha"], d["k"], d["knn_temperature"], len(res["evidence"])) == (0.5, 3, 0.1, 2)
        assert {d["sources"][n] for n in ("alpha", "k", "mixing", "evidence", "knn_temperature")} == {"settings"}
        assert (d["sources"]["kernel"], d["sources"]["lexical_weight"]) == ("default", "bundle")
        res = client.post("/v1/infer", json={"inputs": ["is the cafe open?"], "k": 4}).json()["results"][0]
        assert (res["diagnostics"]["k"], res["diagnostics"]["sources"]["k"]) == (4, "request")


def test_cors_is_off_unless_origins_are_configured(inproc, running_app, make_settings):
    preflight = {"Origin": "https://explorer.example", "Access-Control-Request-Method": "POST"}
    r = inproc.options("/v1/infer", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    with running_app(make_settings(cors_origins=["https://explorer.example"])) as client:
        r = client.options("/v1/infer", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://explorer.example"
        r = client.get("/healthz", headers={"Origin": "https://elsewhere.example"})
        assert "access-control-allow-origin" not in r.headers


def test_request_ids_are_echoed_sanitised_and_logged_as_json(inproc, caplog):
    with caplog.at_level(logging.INFO, logger="softknn.service.access"):
        r = inproc.get("/v1/index", headers={"X-Request-ID": "trace-42"})
        bad = inproc.get("/v1/index", headers={"X-Request-ID": "no spaces or <tags> allowed"})
    assert r.headers["x-request-id"] == "trace-42" and r.json()["request_id"] == "trace-42"
    assert len(bad.headers["x-request-id"]) == 32 and bad.json()["request_id"] == bad.headers["x-request-id"]
    # the access log's records only: caplog holds whatever else was logged meanwhile (another
    # logger's warning from a thread, say), records without the access fields
    access = [rec for rec in caplog.records if rec.name == "softknn.service.access"]
    line = json.loads(JsonFormatter().format(next(rec for rec in access if getattr(rec, "path", None) == "/v1/index")))
    assert {k: line[k] for k in ("level", "msg", "request_id", "method", "route", "status")} == {
        "level": "info", "msg": "GET /v1/index 200", "request_id": "trace-42", "method": "GET",
        "route": "/v1/index", "status": 200}


# --- retrieval: hybrid by default, dense as before, old bundles dense-only -------------------------
def test_exact_dense_request_equals_the_brute_force_reference(api, encoder, engine):
    """What the independent check of the core contract sends: retrieval "dense" with exact."""
    from softknn.infer.reference import reference_embedding

    text = "Can I bring my dog on the Coral Line ferry to Brindlewick?"
    n = len(engine.bundle)
    for mixing in ("fixed", "joint"):
        body = {"inputs": [text], "exact": True, "k": n, "alpha": 0.6, "mixing": mixing, "temperature": 0.07,
                "retrieval": "dense", "evidence": 50}  # limits.max_evidence
        got = api.post("/v1/infer", json=body).json()["results"][0]
        ref, rows, w = reference_embedding(encoder, engine.bundle, text, alpha=0.6, mixing=mixing, k=n,
                                           temperature=0.07)
        assert got["diagnostics"]["retrieval"] == "dense"
        assert np.abs(np.asarray(got["embedding"]) - ref).max() <= 1e-5
        ref_w = {engine.bundle.chunks[r]["chunk_id"]: x for r, x in zip(rows, w)}
        assert max(abs(e["weight"] - ref_w[e["chunk_id"]]) for e in got["evidence"]) <= 1e-6


def test_exact_hybrid_request_equals_the_brute_force_reference(api, encoder, engine):
    from softknn.infer.reference import reference_embedding

    text = "refund for a cancelled sailing in a storm"
    n = len(engine.bundle)
    body = {"inputs": [text], "exact": True, "k": n, "retrieval": "hybrid", "lexical_weight": 0.4,
            "temperature": 0.2, "evidence": 50}
    got = api.post("/v1/infer", json=body).json()["results"][0]
    ref, rows, w = reference_embedding(encoder, engine.bundle, text, alpha=0.7, mixing="fixed", k=n,
                                       temperature=0.2, retrieval="hybrid", lexical_weight=0.4)
    d = got["diagnostics"]
    assert (d["retrieval"], d["lexical_weight"], d["candidates"]) == ("hybrid", 0.4, 200)
    assert np.abs(np.asarray(got["embedding"]) - ref).max() <= 1e-5
    ref_w = {engine.bundle.chunks[r]["chunk_id"]: x for r, x in zip(rows, w)}
    assert max(abs(e["weight"] - ref_w[e["chunk_id"]]) for e in got["evidence"]) <= 1e-6


def test_default_retrieval_is_hybrid_and_the_index_says_what_it_serves(api, engine):
    res = api.post("/v1/infer", json={"inputs": ["can my dog come on board?"], "evidence": 3}).json()["results"][0]
    cal = engine.bundle.manifest.calibration.retrieval_defaults["hybrid"]
    d = res["diagnostics"]
    assert (d["retrieval"], d["lexical_weight"], d["knn_temperature"]) == ("hybrid", cal["lexical_weight"],
                                                                      cal["temperature"])
    assert all(e["bm25"] is not None and isinstance(e["matched_terms"], list) for e in res["evidence"])
    lex = api.get("/v1/index").json()["index"]["lexical"]
    assert (lex["available"], lex["default_retrieval"], lex["settings"]["library"]) == (True, "hybrid", "bm25s")
    assert lex["bytes"] > 0 and lex["bytes_per_chunk"] == round(lex["bytes"] / len(engine.bundle), 1)


def test_a_bundle_without_a_lexical_index_serves_dense_and_refuses_hybrid_with_a_422(running_app, make_settings,
                                                                                   dense_only_bundle_path):
    with running_app(make_settings(dense_only_bundle_path)) as client:
        lex = client.get("/v1/index").json()["index"]["lexical"]
        assert (lex["available"], lex["default_retrieval"]) == (False, "dense") and "add-lexical" in lex["note"]
        ok = client.post("/v1/infer", json={"inputs": ["dogs?"]})
        assert ok.status_code == 200 and ok.json()["results"][0]["diagnostics"]["retrieval"] == "dense"
        bad = client.post("/v1/infer", json={"inputs": ["dogs?"], "retrieval": "hybrid"})
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "retrieval" and "add-lexical" in bad.json()["error"]["message"]
        wrong = client.post("/v1/infer", json={"inputs": ["dogs?"], "retrieval": "sparse"})
        assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "retrieval"
