"""model.runtime=onnx: the export is verified before use, equals torch on real inputs
(plain forward and `exact: true` answers), and a bundle of other numerics is refused."""

from __future__ import annotations

import copy
import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from softknn.common.errors import BundleError, ModelRuntimeError
from softknn.infer.engine import Engine, InferParams, check_numerics
from softknn.model.onnx_forward import TOLERANCE
from tests.conftest import shared_data
from tests.numerics import assert_tree_close


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def onnx_encoder(onnx_cache):
    from softknn.model.encoder import Encoder

    return Encoder(runtime="onnx", onnx_cache=onnx_cache, threads=1)


def _close(a, b):
    """Every number within TOLERANCE (relative above unit scale: tests/numerics.py), everything else
    (ids, labels, ranks, flags) equal."""
    assert_tree_close(a, b, TOLERANCE)


def test_opening_records_the_verification_within_tolerance(onnx_encoder):
    v = onnx_encoder.onnx.verification
    assert v["precision"] == "fp32" and 0 < v["max_abs_diff"] <= TOLERANCE
    assert onnx_encoder.info.runtime == "onnx" and onnx_encoder.info.precision == "fp32"
    assert onnx_encoder.onnx.path.exists() and onnx_encoder.onnx.sidecar.exists()


def _real(x, mask):
    """x's real (non-padded) positions: hidden (B, T, C) or q/k/v (B, nh, T, hs), pads zeroed."""
    return x.masked_fill(~(mask[:, :, None] if x.dim() == 3 else mask[:, None, :, None]), 0)


def test_plain_forward_equals_torch_on_banking77_texts(encoder, onnx_encoder):
    """Every output at every real position; the padded positions of the packed graph's outputs are zero
    (torch has values there, read by no caller: the mask keeps them out of every real token)."""
    with open(shared_data("banking77", "test.csv"), newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)][:48]
    layer = encoder.check_layer(-2)
    for i in range(0, len(texts), 8):  # padded batches of 8
        batch = encoder.tokenize(texts[i:i + 8])
        ref = encoder.forward_plain(batch, keep_hidden=True, capture_layer=layer)
        got = onnx_encoder.forward_plain(batch, keep_hidden=True, capture_layer=layer)
        assert got.embedding.shape == ref.embedding.shape and got.query.shape == ref.query.shape
        assert float((got.embedding - ref.embedding).abs().max()) <= TOLERANCE
        for name in ("token_embeddings", "query", "key", "value"):
            g, r = getattr(got, name), getattr(ref, name)
            assert g.shape == r.shape
            d = float((g - _real(r, batch.mask)).abs().max())
            assert d <= TOLERANCE, (name, d)
        assert len(got.hidden_states) == len(ref.hidden_states) == encoder.info.num_layers + 1
        for h_got, h_ref in zip(got.hidden_states, ref.hidden_states, strict=True):
            assert float((h_got - _real(h_ref, batch.mask)).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("width", [0, 16, None, 10_000])
def test_every_packing_gives_the_same_outputs(encoder, onnx_encoder, width):
    """One row per input (width 0 on equal lengths), several inputs per row, all in one row: the same
    numbers as torch, at a non-default layer too, and padded positions zero."""
    from softknn.model.onnx_forward import Packing

    texts = ["a", "Why was my top-up declined twice today?", "card", "I want to change my PIN at an ATM in Spain.",
             "Zürich → Köln: 12,50 € 🚆", "ok thanks", "How long does a transfer from the UK take?"]
    batch = encoder.tokenize(texts)
    packed = Packing(onnx_encoder, batch.features, width)
    R, W = packed.rows
    assert R * W >= sum(batch.n_tokens) and (width != 10_000 or R == 1)
    ref = encoder.torch_layers(batch)
    got = onnx_encoder.onnx.run(batch.features, width=width)
    for name in ("hidden_2", "query_2", "key_2", "value_2", "hidden_0", "key_5", f"hidden_{encoder.info.num_layers}"):
        assert got[name].shape == ref[name].shape
        assert float((got[name] - _real(ref[name], batch.mask)).abs().max()) <= TOLERANCE, name
        assert float((got[name] - _real(got[name], batch.mask)).abs().max()) == 0.0  # zeros at the pads


def test_exact_answers_equal_torch_answers(engine, onnx_encoder, sample_bundle):
    fast = Engine(onnx_encoder, sample_bundle)
    texts = ["Can I bring my dog on the ferry?", "What happens when a sailing is cancelled because of the weather?",
             "refund", "Is there food on board for vegetarians and how late is the cafe open?"]
    params = [InferParams(exact=True), InferParams(exact=True, mixing="joint"),
              InferParams(exact=True, retrieval="dense", alpha=0.3), InferParams(exact=True, k=16)]
    _close([r.to_dict() for r in engine.infer(texts, params)], [r.to_dict() for r in fast.infer(texts, params)])


def test_a_tampered_export_is_refused(onnx_encoder, tmp_path):
    from softknn.model.encoder import Encoder

    shutil.copy2(onnx_encoder.onnx.path, tmp_path / onnx_encoder.onnx.path.name)
    shutil.copy2(onnx_encoder.onnx.sidecar, tmp_path / onnx_encoder.onnx.sidecar.name)
    path = tmp_path / onnx_encoder.onnx.path.name
    with open(path, "r+b") as f:  # flip bytes in the middle of the weights
        f.seek(path.stat().st_size // 2)
        chunk = f.read(16)
        f.seek(path.stat().st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    with pytest.raises(ModelRuntimeError, match="modified after it was written"):
        Encoder(runtime="onnx", onnx_cache=tmp_path)
    # the default, auto: serves torch instead, and says why
    auto = Encoder(runtime="auto", onnx_cache=tmp_path)
    assert auto.onnx is None and (auto.info.runtime, auto.info.requested) == ("torch", "auto")
    assert "modified after it was written" in auto.info.fallback


def test_the_export_runs_once_per_cache_and_its_record_lands_first(encoder, tmp_path, monkeypatch):
    """Two opens of a fresh cache at once export once (the other waits and uses the file); the sidecar
    is in place when the model file appears; a later open exports nothing."""
    import os
    import threading

    from softknn.model import onnx_forward

    exports, appeared = [], []
    real_export, real_replace = onnx_forward.OnnxForward._export_fp32, os.replace

    def export(self, out):
        exports.append(out)
        real_export(self, out)

    def replace(src, dst):
        if str(dst).endswith(".onnx"):
            appeared.append(Path(dst).with_suffix(".json").exists())
        real_replace(src, dst)

    monkeypatch.setattr(onnx_forward.OnnxForward, "_export_fp32", export)
    monkeypatch.setattr(onnx_forward.os, "replace", replace)
    opened, errors = [], []

    def open_one():
        try:
            opened.append(onnx_forward.OnnxForward(encoder, cache_dir=tmp_path))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(opened) == 2
    assert len(exports) == 1 and appeared == [True]
    assert all(0 < f.verification["max_abs_diff"] <= TOLERANCE for f in opened)
    onnx_forward.OnnxForward(encoder, cache_dir=tmp_path)
    assert len(exports) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [opened[0].path.name, opened[0].sidecar.name])  # no temporary file left behind


def test_an_export_that_disagrees_with_torch_is_refused(onnx_encoder, tmp_path):
    """A graph whose record checks out but whose numbers do not (a wrong export): refused at open."""
    import onnx

    from softknn.model.encoder import Encoder
    from softknn.model.onnx_forward import _sha256

    model = onnx.load(str(onnx_encoder.onnx.path))
    init = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 1
                and onnx.numpy_helper.to_array(t).size == 384)
    arr = onnx.numpy_helper.to_array(init).copy()
    arr[0] += 1e-2  # one bias or norm weight, off by 0.01
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    path = tmp_path / onnx_encoder.onnx.path.name
    onnx.save(model, str(path))
    meta = json.loads(onnx_encoder.onnx.sidecar.read_text()) | {"sha256": _sha256(path)}
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ModelRuntimeError, match=r"differs from torch by .* \(> 0.0001\)"):
        Encoder(runtime="onnx", onnx_cache=tmp_path)


def test_a_packed_export_that_leaks_across_sequences_is_refused(onnx_encoder, tmp_path, monkeypatch):
    """Packing's own failure modes are caught at open: attention that crosses packed sequences (an
    export without the block-diagonal mask), and wrong position ids in the packed rows."""
    import torch

    from softknn.model import onnx_forward
    from softknn.model.encoder import Encoder

    with monkeypatch.context() as m:  # every token sees its whole packed row
        m.setattr(onnx_forward._Layers, "mask", staticmethod(lambda seg: (seg[:, None, :, None] >= -1)
                                                              & (seg[:, None, None, :] >= -1)))
        with pytest.raises(ModelRuntimeError, match=r"differs from torch by .* \(> 0.0001\)"):
            Encoder(runtime="onnx", onnx_cache=tmp_path / "leaky")
    for name in ("path", "sidecar"):  # the good export, opened with position ids that restart at 0 per row
        src = getattr(onnx_encoder.onnx, name)
        (tmp_path / "pos").mkdir(exist_ok=True)
        shutil.copy2(src, tmp_path / "pos" / src.name)
    monkeypatch.setattr(onnx_forward, "_position_ids", lambda enc, ids: torch.zeros_like(ids))
    with pytest.raises(ModelRuntimeError, match=r"differs from torch by .* \(> 0.0001\)"):
        Encoder(runtime="onnx", onnx_cache=tmp_path / "pos")


def test_bundles_of_other_numerics_are_refused(encoder, sample_bundle):
    int8 = SimpleNamespace(runtime="onnx", precision="int8")
    with pytest.raises(BundleError, match="built with torch fp32 numerics, but the model runs onnx int8"):
        check_numerics(sample_bundle.manifest, int8, sample_bundle.path)
    foreign = copy.copy(sample_bundle)
    model = sample_bundle.manifest.raw["model"]
    foreign.manifest = sample_bundle.manifest.replaced(model=model | {"runtime": "onnx", "precision": "int8"})
    with pytest.raises(BundleError, match="built with onnx int8 numerics, but the model runs torch fp32"):
        Engine(encoder, foreign)
    # an older bundle: no runtime recorded = torch fp32
    legacy = sample_bundle.manifest.replaced(model={k: v for k, v in model.items() if k not in ("runtime", "precision")})
    assert (legacy.model.runtime, legacy.model.precision) == ("torch", "fp32")
    check_numerics(legacy, encoder.info, sample_bundle.path)


@pytest.mark.slow  # a whole sample-KB build
def test_the_builder_records_its_runtime_and_onnx_memory_equals_torch_memory(onnx_encoder, sample_bundle_path, sample_kb,
                                                                     tmp_path):
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    build_bundle(sample_kb, tmp_path / "b", BuildConfig(), onnx_encoder, progress=False)
    built = json.loads((tmp_path / "b" / "manifest.json").read_text())
    ref = json.loads((sample_bundle_path / "manifest.json").read_text())
    assert (built["model"]["runtime"], built["model"]["precision"]) == ("onnx", "fp32")
    assert (ref["model"]["runtime"], ref["model"]["precision"]) == ("torch", "fp32")
    assert built["counts"] == ref["counts"]
    assert built["memory"] == ref["memory"] == "hidden"  # the default: layer L's input states, from either runtime
    for name in ("mem_hidden.npy", "embeddings.npy"):
        a = np.load(sample_bundle_path / name).astype(np.float32)
        b = np.load(tmp_path / "b" / name).astype(np.float32)
        assert a.shape == b.shape and float(np.abs(a - b).max()) <= TOLERANCE, name


def test_int8_needs_the_onnx_runtime():
    from pydantic import ValidationError

    from softknn.params import Settings

    # runtime named: SOFTKNN_MODEL__RUNTIME=onnx in the environment (the suite run under onnx) would fill it in
    with pytest.raises(ValidationError, match="model.precision=int8 needs model.runtime=onnx"):
        Settings(model={"runtime": "torch", "precision": "int8"})
    assert Settings(model={"runtime": "onnx", "precision": "int8"}).model.precision == "int8"


def test_auto_builds_with_torch_and_an_explicit_onnx_builds_with_onnx():
    """softknn build under the default runtime (auto) runs torch: the same bundle bytes wherever it is
    built, and the runtime the Ray encode workers run."""
    from softknn.cli import _build_runtime
    from softknn.params import Settings

    assert _build_runtime(Settings(model={"runtime": "auto"})).model.runtime == "torch"
    assert _build_runtime(Settings(model={"runtime": "onnx"})).model.runtime == "onnx"
    assert _build_runtime(Settings(model={"runtime": "torch"})).model.runtime == "torch"
