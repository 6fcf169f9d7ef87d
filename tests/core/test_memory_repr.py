"""Memory representations: every kind gives the memory layer the K/V of stored `kv`,
its fast gather equals its plain reference, and the manifest, verify, info and old bundles agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from softknn.common.errors import BundleError
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest, verify_bundle, version_id
from softknn.storage.memory_stores import MEMORY_KINDS, HiddenStore, RecomputeStore

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
KB = [
    ("m-01", "Dogs must stay on a lead on the car deck and in the outdoor seating areas.", "pets"),
    ("m-02", "Cats travel in a closed carrier; the carrier stays with you in the lounge at all times.", "pets"),
    ("m-03", "A refund is paid within five working days to the card used for the booking.", "refunds"),
    ("m-04", "Cancel up to two hours before departure for a full refund of a flexible fare.", "refunds"),
    ("m-05", "Sailings are cancelled when the wind is forecast above force eight.", "weather"),
    ("m-06", "In fog the crossing is slower and departures may be held until it lifts.", "weather"),
    ("m-07", "The cafe serves hot food until thirty minutes before arrival.", "food"),
    ("m-08", "Vegetarian and gluten-free meals are always on the menu.", "food"),
]
QUERIES = ["can my dog come on the deck?", "when do I get my money back", "is the ferry running in a storm"]
# |Δ| bounds against stored float32 K/V: round-off for the exact kinds; the lossy kinds' measured
# worst case on this KB with a margin (bench/memory_repr.py measures them on Banking77 and ObliQA)
KV_TOL = {"kv": 0.0, "hidden": 1e-5, "recompute": 1e-5, "hidden-fp16": 5e-3, "hidden-int8": 5e-2}
OUT_TOL = {"kv": 0.0, "hidden": 1e-5, "recompute": 1e-5, "hidden-fp16": 1e-4, "hidden-int8": 1e-3}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, encoder) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("memory_repr")
    kb = root / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in KB))
    out = {}
    for kind in MEMORY_KINDS:
        out[kind] = root / kind
        build_bundle(kb, out[kind], BuildConfig(memory=kind, batch_size=3), encoder, progress=False)
    return out


@pytest.fixture(scope="module")
def engines(bundles, encoder) -> dict[str, Engine]:
    return {kind: Engine(encoder, load_bundle(path)) for kind, path in bundles.items()}


IDS, WEIGHTS = [[0, 5, 2], [7], [3, 1, 6, 4]], [[0.5, 0.3, 0.2], [1.0], [0.4, 0.3, 0.2, 0.1]]


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_gather_equals_its_per_chunk_reference(engines, kind):
    store = engines[kind].bundle.kv
    fast, ref = store.gather(IDS, WEIGHTS, CPU), store.gather_reference(IDS, WEIGHTS, CPU)
    assert fast.key.shape == ref.key.shape == (3, 12, 4, fast.key.shape[3], 32)
    assert torch.equal(fast.token_mask, ref.token_mask) and torch.equal(fast.weight, ref.weight)
    tol = 0.0 if kind == "kv" else 1e-5  # the references project in float64, or run one chunk alone
    assert float((fast.key - ref.key).abs().max()) <= tol
    assert float((fast.value - ref.value).abs().max()) <= tol


@pytest.mark.parametrize("kind", MEMORY_KINDS[1:])
def test_kinds_give_the_stored_float32_kv(engines, kind):
    kv = engines["kv"].bundle.kv.gather(IDS, WEIGHTS, CPU)
    got = engines[kind].bundle.kv.gather(IDS, WEIGHTS, CPU)
    assert torch.equal(got.token_mask, kv.token_mask)
    dk, dv = float((got.key - kv.key).abs().max()), float((got.value - kv.value).abs().max())
    assert max(dk, dv) <= KV_TOL[kind], (dk, dv)
    if kind in ("hidden-fp16", "hidden-int8"):
        assert max(dk, dv) > 0  # lossy: a bound that could never be reached would test nothing


def test_project_kv_reproduces_the_captured_layer_kv(encoder):
    batch = encoder.tokenize([t for _, t, _ in KB[:3]])
    plain = encoder.forward_plain(batch, capture_layer=5, keep_hidden=True)
    k, v = encoder.project_kv(5, plain.hidden_states[5][0])  # (T, nh, hs)
    assert torch.allclose(k.transpose(0, 1), plain.key[0], atol=1e-5, rtol=0)
    assert torch.allclose(v.transpose(0, 1), plain.value[0], atol=1e-5, rtol=0)
    ck, cv = encoder.capture_kv(batch, 5)  # layers 0..5 only
    assert torch.equal(ck, plain.key) and torch.equal(cv, plain.value)


@pytest.mark.parametrize("kind", MEMORY_KINDS[1:])
def test_engine_exact_answers_match_kv(engines, kind):
    params = [InferParams(exact=True, k=4, retrieval="dense")] * len(QUERIES)
    want = engines["kv"].infer(QUERIES, params)
    got = engines[kind].infer(QUERIES, params)
    for w, g in zip(want, got, strict=True):
        assert [e.chunk_id for e in g.evidence] == [e.chunk_id for e in w.evidence]
        d = float(np.abs(np.array(g.embedding) - np.array(w.embedding)).max())
        assert d <= OUT_TOL[kind], d


def test_manifest_names_the_memory_and_checksums_its_files(bundles):
    sizes = {}
    for kind, path in bundles.items():
        m = verify_bundle(path)
        assert m["memory"] == kind
        mem = [f for f in m["files"] if f.startswith(("kv_", "mem_"))]
        assert sorted(mem) == sorted({"kv": ["kv_keys.npy", "kv_values.npy"], "recompute": [],
                                      "hidden-int8": ["mem_hidden.npy", "mem_hidden_scale.npy"]}.get(kind, ["mem_hidden.npy"]))
        sizes[kind] = load_bundle(path).summary()["memory"]["bytes"]
    ntok = read_manifest(bundles["kv"])["counts"]["tokens"]
    header = 128  # one .npy header
    assert sizes["kv"] == 2 * (header + ntok * 12 * 32 * 4)
    assert sizes["hidden"] == header + ntok * 384 * 4
    assert sizes["hidden-fp16"] == header + ntok * 384 * 2
    assert sizes["hidden-int8"] == header + ntok * 384 + header + 384 * 4
    assert sizes["recompute"] == 0
    bad = bundles["hidden-int8"] / "mem_hidden_scale.npy"
    data = bad.read_bytes()
    try:
        bad.write_bytes(data[:-4] + b"\0\0\0\0")
        with pytest.raises(BundleError, match=r"mem_hidden_scale.npy: sha256 mismatch"):
            verify_bundle(bundles["hidden-int8"])
    finally:
        bad.write_bytes(data)


def test_loaders_pick_the_store_and_refuse_to_compute_unattached(bundles):
    b = load_bundle(bundles["hidden-int8"])
    assert isinstance(b.kv, HiddenStore) and b.kv.hidden.dtype == np.int8 and b.kv.scale.shape == (384,)
    assert isinstance(load_bundle(bundles["recompute"]).kv, RecomputeStore)
    with pytest.raises(BundleError, match=r"attach\(encoder, layer\) first"):
        b.kv.gather(IDS, WEIGHTS, CPU)


def test_bundle_without_memory_field_loads_as_kv(bundles, engines, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for f in bundles["kv"].iterdir():
        if f.is_file():
            (old / f.name).write_bytes(f.read_bytes())
    (old / "lexical").mkdir()
    for f in (bundles["kv"] / "lexical").iterdir():
        (old / "lexical" / f.name).write_bytes(f.read_bytes())
    m = json.loads((old / "manifest.json").read_text())
    del m["memory"]  # as an older bundle, built before the field existed
    m["version_id"] = version_id(m)
    (old / "manifest.json").write_text(json.dumps(m))
    b = load_bundle(old)
    assert b.summary()["memory"]["kind"] == "kv" and b.summary()["memory"]["files"] == ["kv_keys.npy", "kv_values.npy"]
    want = engines["kv"].bundle.kv.gather(IDS, WEIGHTS, CPU)
    got = b.kv.gather(IDS, WEIGHTS, CPU)
    assert torch.equal(got.key, want.key) and torch.equal(got.value, want.value)


def _cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", SOFTKNN_MODEL__THREADS="1")
    return subprocess.run([sys.executable, "-m", "softknn", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # three CLI processes, each loading the model
def test_cli_info_reports_memory_and_bad_memory_is_refused(bundles, tmp_path):
    info = _cli("info", bundles["hidden-int8"])
    assert info.returncode == 0, info.stderr
    m = json.loads(info.stdout)
    ntok = m["counts"]["tokens"]
    assert m["memory"] == "hidden-int8"
    assert m["memory_summary"]["kind"] == "hidden-int8"
    assert m["memory_summary"]["bytes"] == 128 + ntok * 384 + 128 + 384 * 4
    assert m["memory_summary"]["bytes_per_chunk"] == round(m["memory_summary"]["bytes"] / len(KB), 1)
    ok = _cli("verify", bundles["recompute"])
    assert ok.returncode == 0 and "memory recompute" in ok.stdout
    bad = _cli("build", ROOT / "README.md", "--out", tmp_path / "x", "--memory", "int4")
    assert bad.returncode == 2
    assert "memory must be one of kv, hidden, hidden-fp16, hidden-int8, recompute, not 'int4'" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_kv_dtype_applies_to_kv_only(encoder, tmp_path):
    kb = tmp_path / "kb.jsonl"
    kb.write_text(json.dumps({"id": "a", "text": "one chunk"}) + "\n")
    with pytest.raises(ValueError, match="kv_dtype 'float16' applies to memory 'kv' only"):
        build_bundle(kb, tmp_path / "b", BuildConfig(memory="hidden", kv_dtype="float16"), encoder, progress=False)
    with pytest.raises(ValueError, match=r"memory 'hidden' sets its own dtype \(build with --memory kv"):
        build_bundle(kb, tmp_path / "b", BuildConfig(kv_dtype="float16"), encoder, progress=False)  # the default
    assert not (tmp_path / "b").exists()
    from typer.testing import CliRunner

    from softknn.cli import app

    r = CliRunner().invoke(app, ["build", str(kb), "--out", str(tmp_path / "c"), "--kv-dtype", "float16"])
    assert r.exit_code == 2 and "applies to memory 'kv' only" in " ".join(r.output.split()), r.output
    assert not (tmp_path / "c").exists()
    m = build_bundle(kb, tmp_path / "d", BuildConfig(memory="kv", kv_dtype="float16"), encoder, progress=False)
    assert (m["memory"], m["kv_dtype"]) == ("kv", "float16")


def test_hidden_memory_needs_the_layers_key_value_linear(encoder, bundles, tmp_path):
    """A model whose memory layer has no key/value Linear cannot project stored states: the default
    build refuses before encoding, and a hidden bundle is refused when the engine attaches it (not
    at its first query)."""
    from softknn.common.errors import UnsupportedModel

    layer = encoder.check_layer(-1)
    attn = encoder.attention_modules[layer]
    key = attn.key
    attn.key = torch.nn.Identity()  # restored below: the model is the session's (monkeypatch deletes a submodule)
    try:
        kb = tmp_path / "kb.jsonl"
        kb.write_text(json.dumps({"id": "a", "text": "one chunk"}) + "\n")
        with pytest.raises(UnsupportedModel, match=rf"layer {layer}'s attention has no key/value Linear .*build with --memory kv"):
            build_bundle(kb, tmp_path / "b", BuildConfig(), encoder, progress=False)
        assert not (tmp_path / "b").exists()
        with pytest.raises(UnsupportedModel, match="no key/value Linear"):
            Engine(encoder, load_bundle(bundles["hidden"]))
        Engine(encoder, load_bundle(bundles["kv"]))  # stored K/V need no projection
    finally:
        attn.key = key
    assert encoder.attention_modules[layer].key is key
