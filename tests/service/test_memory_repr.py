"""The service on a compact-memory bundle: `exact: true` answers equal those of the same
KB built with stored float32 K/V, and /v1/index names the memory and its bytes per chunk."""

from __future__ import annotations

import json

import numpy as np
import pytest

from softknn.index_builder.pipeline import BuildConfig, build_bundle
from tests.service.conftest import SMALL_KB, settings_for

BODY = {"inputs": ["can I bring my dog on the ferry?", "when does the cafe close?", "refund after cancelling"],
        "exact": True, "k": 4, "retrieval": "dense"}


@pytest.fixture(scope="module")
def small_bundles(tmp_path_factory, encoder) -> dict:
    root = tmp_path_factory.mktemp("memory_repr_service")
    kb = root / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in SMALL_KB))
    out = {}
    for kind in ("kv", "hidden", "recompute"):
        out[kind] = root / kind
        build_bundle(kb, out[kind], BuildConfig(memory=kind), encoder, progress=False)
    return out


def _answers(running_app, bundle):
    with running_app(settings_for(bundle)) as client:
        r = client.post("/v1/infer", json=BODY)
        assert r.status_code == 200, r.text
        return r.json()["results"], client.get("/v1/index").json()["index"]


@pytest.mark.parametrize("kind", ["hidden", "recompute"])
def test_exact_answers_over_http_equal_stored_kv(running_app, small_bundles, kind):
    want, kv_index = _answers(running_app, small_bundles["kv"])
    got, index = _answers(running_app, small_bundles[kind])
    assert kv_index["memory"]["kind"] == "kv" and index["memory"]["kind"] == kind
    for w, g in zip(want, got, strict=True):
        assert [e["chunk_id"] for e in g["evidence"]] == [e["chunk_id"] for e in w["evidence"]]
        assert [e["weight"] for e in g["evidence"]] == pytest.approx([e["weight"] for e in w["evidence"]], abs=1e-6)
        assert float(np.abs(np.array(g["embedding"]) - np.array(w["embedding"])).max()) <= 1e-5
    ntok = kv_index["counts"]["tokens"]
    per_chunk = {"hidden": 128 + ntok * 384 * 4, "recompute": 0}[kind] / len(SMALL_KB)
    assert index["memory"]["bytes_per_chunk"] == round(per_chunk, 1)
    assert kv_index["memory"]["bytes_per_chunk"] == round(2 * (128 + ntok * 384 * 4) / len(SMALL_KB), 1)
