"""Typed results and manifests: what the engine returns and how a bundle's manifest is read."""

from __future__ import annotations

import dataclasses
import json
import shutil
import typing

import orjson
import pytest

from softknn.common.errors import BundleError
from softknn.infer import results
from softknn.infer.engine import InferParams
from softknn.service import schemas
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import MANIFEST, read_manifest, version_id
from softknn.storage.manifest import Manifest

# each result dataclass and the response models that document it for OpenAPI (the one evidence type: as
# /v1/infer and as /v1/generate answer it)
PAIRS = [(results.InferResult, [schemas.InferResult]), (results.EvidenceItem, [schemas.EvidenceItem, schemas.GenEvidenceItem]),
         (results.Span, [schemas.Span, schemas.GenSpan]), (results.QueryToken, [schemas.QueryToken]),
         (results.Diagnostics, [schemas.Diagnostics]), (results.Token, [schemas.Token]),
         (results.Neighbour, [schemas.Neighbour]), (results.VersusPlain, [schemas.VersusPlain])]


@pytest.mark.parametrize(("typed", "documents"), PAIRS, ids=[t.__name__ for t, _ in PAIRS])
def test_every_result_field_is_documented_and_every_documented_field_exists(typed, documents):
    hints = typing.get_type_hints(typed)
    for documented in documents:
        assert [f.name for f in dataclasses.fields(typed)] == list(documented.model_fields), documented
    for name in hints:  # optional in the result where some route documents it optional (evidence's
        # influence: null for a generated answer; its tokens: null for an inference), and only there
        documented = [type(None) in typing.get_args(d.model_fields[name].annotation) for d in documents]
        assert (type(None) in typing.get_args(hints[name])) == any(documented), name


@pytest.fixture(scope="module")
def answer(engine):
    return engine.infer(["Can I bring my dog on the ferry?"], InferParams(k=4, evidence=2, return_tokens=True))[0]


def test_a_result_renders_the_same_through_orjson_and_to_dict_and_validates_against_the_schema(answer):
    assert isinstance(answer.evidence[0], results.EvidenceItem) and isinstance(answer.diagnostics, results.Diagnostics)
    fast = orjson.loads(orjson.dumps(answer))  # what the route sends
    assert fast == json.loads(json.dumps(answer.to_dict()))  # what `softknn query --json` prints
    assert schemas.InferResult.model_validate(fast).model_dump() == fast
    assert fast["versus_plain"]["nearest_plain"][0].keys() == {"chunk_id", "label", "similarity"}
    assert len(fast["tokens"]) == answer.diagnostics.n_tokens


def test_results_are_immutable_and_truncated_derives_a_new_one(answer):
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.prediction = "something else"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.diagnostics.truncated = True  # type: ignore[misc]
    cut = answer.truncated()
    assert cut.diagnostics.truncated is True and answer.diagnostics.truncated is False
    assert cut.evidence is answer.evidence and cut.embedding is answer.embedding
    assert dataclasses.replace(cut.diagnostics, truncated=False) == answer.diagnostics


def test_the_loaded_manifest_is_typed_and_keeps_what_it_does_not_know(sample_bundle_path, tmp_path):
    b = load_bundle(sample_bundle_path, verify=False)
    raw = read_manifest(sample_bundle_path)
    assert isinstance(b.manifest, Manifest) and b.manifest.raw == raw
    assert (b.manifest.model.fingerprint, b.manifest.counts.chunks) == (raw["model"]["fingerprint"], len(b))
    assert b.manifest.memory == raw.get("memory", "kv") and b.version == raw["version_id"]
    assert b.manifest.calibration.min_similarity == raw["calibration"]["min_similarity"]
    newer = Manifest.of({**raw, "from_a_newer_builder": {"x": 1}}, "m")
    assert newer.model_extra["from_a_newer_builder"] == {"x": 1}


@pytest.mark.parametrize(("edit", "named"), [
    (lambda m: m["model"].pop("fingerprint"), "model.fingerprint: Field required"),
    (lambda m: m["counts"].update(chunks="many"), "counts.chunks: Input should be a valid integer"),
    (lambda m: m.update(memory_layer=None), "memory_layer: Input should be a valid integer"),
])
def test_a_malformed_manifest_is_a_bundle_error_naming_the_field(sample_bundle_path, tmp_path, edit, named):
    b = tmp_path / "b"
    shutil.copytree(sample_bundle_path, b)
    m = json.loads((b / MANIFEST).read_text())
    edit(m)
    m["version_id"] = version_id(m)  # a consistent record, only malformed
    (b / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match=f"malformed manifest: {named}"):
        load_bundle(b)
