"""`filter` over HTTP: the service answers what the engine answers under the same filter, and a bad
filter is a 422 in the one error shape that names it."""

from __future__ import annotations

import pytest

from softknn.infer.engine import InferParams
from softknn.retrieval.filters import MAX_DEPTH, ChunkTable, parse_filter
from softknn.service.schemas import InferResponse

FILTER = {"and": [{"field": "label", "in": ["pets_and_animals", "luggage_and_cargo"]},
                  {"not": {"field": "doc_id", "in": ["faq-0110", "faq-0128"]}}]}


@pytest.mark.parametrize("exact", [False, True])
def test_a_filtered_request_equals_the_engine_run_directly(api, engine, assert_same, exact):
    text = "can I bring my dog and a big suitcase on the ferry?"
    r = api.post("/v1/infer", json={"inputs": [text], "filter": FILTER, "exact": exact, "evidence": 8})
    assert r.status_code == 200, r.text
    InferResponse.model_validate(r.json())
    got = r.json()["results"][0]
    want = engine.infer([text], InferParams(filter=parse_filter(FILTER), exact=exact, evidence=8))[0]
    assert_same(got, want)
    n = int(ChunkTable.of(engine.bundle.chunks).mask(parse_filter(FILTER)).sum())
    assert got["diagnostics"]["filtered"] == n and 8 <= n < len(engine.bundle)
    assert len(got["evidence"]) == 8
    assert {e["label"] for e in got["evidence"]} <= {"pets_and_animals", "luggage_and_cargo"}
    assert not {e["doc_id"] for e in got["evidence"]} & {"faq-0110", "faq-0128"}
    plain = api.post("/v1/infer", json={"inputs": [text], "exact": exact}).json()["results"][0]
    assert plain["diagnostics"]["filtered"] is None
    assert "faq-0110" in {e["doc_id"] for e in plain["evidence"]}  # the filter did take something out


def _deep(levels: int) -> dict:
    f: dict = {"field": "label", "eq": "x"}
    for _ in range(levels - 1):
        f = {"not": f}
    return f


@pytest.mark.parametrize("flt,kind,field,says", [
    ({"field": "title", "eq": "x"}, "validation_error", "filter", "unknown filter field 'title'"),
    ({"field": "label", "eq": "x", "neq": "y"}, "validation_error", "filter", "Extra inputs"),
    ({"field": "label", "in": "x"}, "validation_error", "filter", "valid list"),
    ({"field": "label"}, "validation_error", "filter", "exactly one of"),
    ({"xor": [1]}, "validation_error", "filter", "a filter is"),
    ("label = x", "validation_error", "filter", "a filter is"),
    (_deep(MAX_DEPTH + 1), "validation_error", "filter", f"deeper than {MAX_DEPTH}"),
    ({"or": [{"field": "label", "eq": "x"}] * 65}, "validation_error", "filter", "more than 64"),
    ({"field": "metadata.year", "gte": 2020}, "invalid_input", "filter", "'metadata.year': no chunk of this KB has it"),
    ({"field": "label", "lt": 3}, "invalid_input", "filter", "'label' holds no numbers"),
])
def test_a_bad_filter_is_a_422_naming_it(inproc, flt, kind, field, says):
    r = inproc.post("/v1/infer", json={"inputs": ["dogs"], "filter": flt})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == kind and err["field"].startswith(field) and says in err["message"], err
    assert inproc.post("/v1/infer", json={"inputs": ["dogs"]}).status_code == 200  # nothing else is affected
