"""Schemathesis hooks for tests/reliability/test_fuzz.py (loaded with SCHEMATHESIS_HOOKS).

1. OpenAPI links, injected into the live document as it is loaded, so the stateful phase can chain
   calls the way a client does (the service's own document carries no links; adding them would
   change the committed openapi.json that clients/python is generated from):
       POST /v1/infer 200  → GET  /v1/entries/{chunk_id}   chunk_id = results[0].evidence[0].chunk_id
       GET  /v1/index 200  → POST /v1/admin/reload          bundle   = index.path (a real swap)
       POST /v1/admin/reload 200 → GET /v1/index, GET /v1/entries/{chunk_id}   chunk_id = index.version_id
   Only these links: schemathesis's own link inference is off (schemathesis.toml), so "every link was
   followed" counts the chains written here. (Its inferred PUT → GET /v1/documents/{doc_id} link went
   unfollowed in 143 seeded scenarios, and so did the same chain written here: a PUT is one root of
   sixteen. Writes read back are tested in tests/service/test_documents.py.)
2. The filter schema nested one level for the fuzzer: `filter` is recursive (and/or/not of filters),
   and the coverage phase enumerates every nested variant (5,611 cases for /v1/infer alone, 122 s
   here, past the test's time limit); in the copy it loads, and/or/not take field tests only. The
   deeper trees and their limits are tested in tests/core/test_filters.py and tests/service/test_filters.py.
3. A request log: every response's status, appended as one line to $SOFTKNN_FUZZ_LOG
   ("METHOD PATH STATUS"), so the test counts requests and statuses from the client side too.
"""

from __future__ import annotations

import os

import schemathesis

LINKS = {
    ("/v1/infer", "post"): {
        "GetEvidenceEntry": {
            "operationId": "entry",
            "parameters": {"chunk_id": "$response.body#/results/0/evidence/0/chunk_id"},
        },
    },
    ("/v1/index", "get"): {
        "ReloadServedBundle": {
            "operationId": "reload",
            "requestBody": {"bundle": "$response.body#/index/path"},
        },
    },
    ("/v1/admin/reload", "post"): {
        "IndexAfterReload": {"operationId": "index"},
        "EntryAfterReload": {"operationId": "entry",
                             "parameters": {"chunk_id": "$response.body#/index/version_id"}},
    },
}


@schemathesis.hook
def before_load_schema(context, raw_schema: dict) -> None:
    ops = {op.get("operationId") for item in raw_schema["paths"].values() for op in item.values()
           if isinstance(op, dict)}
    for (path, method), links in LINKS.items():
        missing = {link["operationId"] for link in links.values()} - ops
        if missing:
            raise RuntimeError(f"st_hooks: no operation {sorted(missing)} in the document; update LINKS")
        raw_schema["paths"][path][method]["responses"]["200"]["links"] = links
    schemas = raw_schema["components"]["schemas"]
    leaf = {"$ref": "#/components/schemas/FilterMatch"}
    for name, key in (("FilterAnd", "and"), ("FilterOr", "or")):
        schemas[name]["properties"][key]["items"] = leaf
    schemas["FilterNot"]["properties"]["not"] = {**leaf, "description": schemas["FilterNot"]["properties"]["not"].get(
        "description", "")}


@schemathesis.hook
def after_call(context, case, response) -> None:
    path = os.environ.get("SOFTKNN_FUZZ_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{case.method} {case.operation.path} {response.status_code}\n")
