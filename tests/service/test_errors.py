"""Every bad input class gets its 4xx in the one error shape, in process and over real HTTP."""

from __future__ import annotations

import json

import pytest

JSON = {"content-type": "application/json"}


def err(kind: str, message: str, field: str | None = None) -> dict:
    return {"error": {"type": kind, "message": message, "field": field}}


BAD = [
    # (id, raw body, status, payload)
    ("malformed_json", '{"inputs": ["a"', 400,
     err("malformed_json", "request body is not valid JSON: Expecting ',' delimiter at char 15")),
    ("empty_body", "", 422, err("validation_error", "request body: Field required")),
    ("not_an_object", "[1, 2]", 422,
     err("validation_error", "request body: Input should be a valid dictionary or object to extract fields from")),
    ("nan", '{"inputs": ["a"], "alpha": NaN}', 422,
     err("validation_error", "alpha: Input should be a finite number", "alpha")),
    ("inf", '{"inputs": ["a"], "temperature": Infinity}', 422,
     err("validation_error", "temperature: Input should be a finite number", "temperature")),
    ("overflowing_float", '{"inputs": ["a"], "alpha": 1e999}', 422,
     err("validation_error", "alpha: Input should be a finite number", "alpha")),
    ("huge_int", json.dumps({"inputs": ["a"], "k": 10**40}), 422,
     err("validation_error", "k: Input should be less than or equal to 512", "k")),
    ("huge_temperature", json.dumps({"inputs": ["a"], "temperature": 1e300}), 422,
     err("validation_error", "temperature: Input should be less than or equal to 1000000", "temperature")),
    ("string_for_int", json.dumps({"inputs": ["a"], "k": "5"}), 422,
     err("validation_error", "k: Input should be a valid integer", "k")),
    ("float_for_int", json.dumps({"inputs": ["a"], "k": 5.5}), 422,
     err("validation_error", "k: Input should be a valid integer", "k")),
    ("int_for_bool", json.dumps({"inputs": ["a"], "exact": 1}), 422,
     err("validation_error", "exact: Input should be a valid boolean", "exact")),
    ("string_for_list", json.dumps({"inputs": "a"}), 422,
     err("validation_error", "inputs: Input should be a valid list", "inputs")),
    ("number_in_list", json.dumps({"inputs": ["a", 3]}), 422,
     err("validation_error", "inputs[1]: Input should be a valid string", "inputs[1]")),
    ("bad_enum", json.dumps({"inputs": ["a"], "mixing": "both"}), 422,
     err("validation_error", "mixing: Input should be 'fixed' or 'joint'", "mixing")),
    ("alpha_out_of_range", json.dumps({"inputs": ["a"], "alpha": 1.5}), 422,
     err("validation_error", "alpha: Input should be less than or equal to 1", "alpha")),
    ("threshold_out_of_range", json.dumps({"inputs": ["a"], "threshold": 1.0}), 422,
     err("validation_error", "threshold: Input should be less than 1", "threshold")),
    ("negative_evidence", json.dumps({"inputs": ["a"], "evidence": -1}), 422,
     err("validation_error", "evidence: Input should be greater than or equal to 0", "evidence")),
    ("empty_string", json.dumps({"inputs": ["fine", ""]}), 422,
     err("validation_error", "inputs[1]: text must contain at least one non-whitespace character", "inputs[1]")),
    ("whitespace_string", json.dumps({"inputs": [" \n\t "]}), 422,
     err("validation_error", "inputs[0]: text must contain at least one non-whitespace character", "inputs[0]")),
    ("lone_surrogate", '{"inputs": ["a\\ud800b"]}', 422,
     err("validation_error", "inputs[0]: text is not valid Unicode (lone surrogate escape)", "inputs[0]")),
    ("no_inputs", json.dumps({"inputs": []}), 422,
     err("validation_error", "inputs: List should have at least 1 item after validation, not 0", "inputs")),
    ("missing_inputs", json.dumps({"k": 3}), 422, err("validation_error", "inputs: Field required", "inputs")),
    ("unknown_field", json.dumps({"inputs": ["a"], "top_k": 3}), 422,
     err("validation_error", "top_k: Extra inputs are not permitted", "top_k")),
    ("too_many_inputs", json.dumps({"inputs": ["a"] * 65}), 413,
     err("input_too_large", "65 inputs, more than the limit 64", "inputs")),
    ("too_many_chars", json.dumps({"inputs": ["ok", "x" * 20_001]}), 413,
     err("input_too_large", "inputs[1] has 20001 characters, more than the limit 20000; send truncate=true to cut it",
         "inputs[1]")),
    ("too_many_tokens", json.dumps({"inputs": ["ferry " * 300]}), 413,
     err("input_too_large", "inputs[0] has 302 tokens, more than the limit 256; send truncate=true to cut it",
         "inputs[0]")),
]


@pytest.mark.parametrize("raw,status,payload", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_gets_its_status_and_the_one_error_shape(api, raw, status, payload):
    r = api.post("/v1/infer", content=raw.encode(), headers=JSON)
    assert (r.status_code, r.json()) == (status, payload)
    assert r.headers["content-type"] == "application/json"


def test_truncate_cuts_long_inputs_instead_of_refusing(api):
    inputs = ["ferry " * 300, "ferry " * 4000, "y" * 20_001, "short"]
    r = api.post("/v1/infer", json={"inputs": inputs, "truncate": True, "evidence": 0})
    assert r.status_code == 200
    d = [(res["diagnostics"]["n_tokens"], res["diagnostics"]["truncated"]) for res in r.json()["results"]]
    # tokens cut; characters then tokens cut; characters cut (one 20,000-char word is one [UNK]); untouched
    assert d == [(256, True), (256, True), (3, True), (3, False)]


def test_bad_requests_do_not_stall_the_worker(api):
    for raw, *_ in [b[1:] for b in BAD]:
        api.post("/v1/infer", content=raw.encode(), headers=JSON)
    r = api.post("/v1/infer", json={"inputs": ["still answering?"]})
    assert r.status_code == 200


def test_unknown_route_and_wrong_method(api):
    r = api.get("/v1/nothing-here")
    assert (r.status_code, r.json()) == (404, err("not_found", "no route /v1/nothing-here"))
    r = api.get("/v1/infer")
    assert (r.status_code, r.json()) == (405, err("method_not_allowed", "method GET not allowed on /v1/infer"))
    assert r.headers["allow"] == "POST"
    r = api.delete("/v1/index")
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")


def test_body_over_the_limit_is_413_declared_or_streamed(running_app, make_settings):
    with running_app(make_settings(limits={"max_body_bytes": 4096})) as client:
        r = client.post("/v1/infer", content=b"x" * 5000, headers=JSON)
        assert (r.status_code, r.json()) == (
            413, err("payload_too_large", "request body of 5000 bytes is larger than the limit 4096"))
        chunks = (b"y" * 1000 for _ in range(6))  # no Content-Length: counted as it streams
        r = client.post("/v1/infer", content=chunks, headers=JSON)
        assert (r.status_code, r.json()) == (413, err("payload_too_large", "request body larger than 4096 bytes"))


def test_body_over_the_limit_over_real_http(server):
    r = server.post("/v1/infer", content=b" " * 2_000_001, headers=JSON)
    assert (r.status_code, r.json()) == (
        413, err("payload_too_large", "request body of 2000001 bytes is larger than the limit 2000000"))


def test_service_token_limit_below_the_model_limit(running_app, make_settings):
    with running_app(make_settings(limits={"max_tokens": 16})) as client:
        text = "the morning ferry to the island leaves at seven and returns at noon every day of the week"
        r = client.post("/v1/infer", json={"inputs": [text]})
        assert (r.status_code, r.json()) == (413, err(
            "input_too_large", "inputs[0] has 20 tokens, more than the limit 16; send truncate=true to cut it",
            "inputs[0]"))
        r = client.post("/v1/infer", json={"inputs": [text], "truncate": True, "evidence": 0})
        assert r.status_code == 200
        d = r.json()["results"][0]["diagnostics"]
        assert (d["n_tokens"], d["truncated"]) == (16, True)


def test_integers_are_accepted_where_numbers_are_expected(api):
    r = api.post("/v1/infer", json={"inputs": ["a dog on board?"], "alpha": 1, "temperature": 1, "evidence": 0})
    assert r.status_code == 200
    d = r.json()["results"][0]["diagnostics"]
    assert (d["alpha"], d["knn_temperature"]) == (1.0, 1.0)
