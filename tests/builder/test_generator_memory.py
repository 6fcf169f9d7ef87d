"""The builder's generator pass: stored K/V equal the generator's own, every representation is
checksummed and verified, a killed pass resumes to the same bytes, and a bundle refuses other weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from softknn.bundle import load_bundle, verify_bundle
from softknn.engine import Engine
from softknn.errors import BundleError
from softknn.gen_memory import GeneratorStore, generator_files
from softknn.generation import GenEngine, GenParams
from softknn.generator import Generator, Sampling
from softknn.index_builder.generator_memory import BATCH
from softknn.index_builder.pipeline import BuildConfig, build_bundle


@pytest.fixture(scope="module")
def gen() -> Generator:
    return Generator.load()


@pytest.fixture(scope="module")
def kb20(tmp_path_factory, sample_kb) -> Path:
    d = tmp_path_factory.mktemp("kb20")
    lines = (Path(sample_kb) / "kb.jsonl").read_text(encoding="utf-8").splitlines()[:20]
    (d / "kb.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _build(kb, out, encoder, gen, memory="fp16", layers="all", **kw):
    cfg = BuildConfig(generator_memory=memory, generator_layers=layers, calibrate=False)
    return build_bundle(kb, out, cfg, encoder, progress=False, generator=gen, **kw)


@pytest.fixture(scope="module")
def fp32_bundle(tmp_path_factory, kb20, encoder, gen) -> Path:
    out = tmp_path_factory.mktemp("gen") / "b32"
    _build(kb20, out, encoder, gen, memory="fp32", layers="0,14,29")
    return out


def test_stored_memory_is_the_generators_own_kv_after_the_prefix(fp32_bundle, gen):
    m = verify_bundle(fp32_bundle)
    g = m["generator"]
    assert (g["layers"], g["memory"], g["prefix"]) == ([0, 14, 29], "fp32", gen.memory_prefix())
    assert g["fingerprint"] == gen.info.fingerprint
    store = GeneratorStore(fp32_bundle, g, m["counts"]["chunks"])
    chunks = [json.loads(x) for x in (fp32_bundle / "chunks.jsonl").read_text().splitlines()]
    row = 7
    assert store.token_ids(row) == gen.memory_ids(chunks[row]["text"])
    want = gen.chunk_kv([store.token_ids(row)], [0, 14, 29], prefix=gen.memory_prefix())[0]
    assert np.abs(store.chunk(row).numpy() - want).max() <= 1e-5  # batched in the build, alone here
    n_tok = int(store.offsets[-1])
    assert g["tokens"] == n_tok and g["bytes_per_chunk"] == pytest.approx(
        (n_tok * 3 * 2 * 3 * 64 * 4 + 128) / m["counts"]["chunks"], rel=1e-3)  # + the .npy header


@pytest.mark.parametrize("memory", ["fp16", "int8", "recompute"])
def test_each_representation_verifies_and_keeps_the_kv_close(tmp_path, kb20, encoder, gen, fp32_bundle, memory):
    out = tmp_path / memory
    m = _build(kb20, out, encoder, gen, memory=memory, layers="0,14,29")
    assert set(generator_files(memory)) <= set(m["files"])
    verify_bundle(out)
    if memory == "recompute":
        assert m["generator"]["bytes_per_chunk"] == 0.0 and not (out / "generator" / "kv.npy").exists()
        return
    ref = GeneratorStore(fp32_bundle, verify_bundle(fp32_bundle)["generator"], 20)
    got = GeneratorStore(out, m["generator"], 20)
    err = max(float((got.chunk(r) - ref.chunk(r)).abs().max() / ref.chunk(r).abs().max()) for r in range(20))
    assert err <= {"fp16": 1e-3, "int8": 1.0 / 127}[memory]  # relative to the chunk's largest value
    assert m["generator"]["bytes_per_chunk"] < ref.bytes_per_chunk / {"fp16": 1.9, "int8": 3.5}[memory]


def test_a_flipped_byte_in_the_generator_memory_is_refused(tmp_path, fp32_bundle):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(fp32_bundle, bad)
    p = bad / "generator" / "kv.npy"
    with open(p, "r+b") as f:
        f.seek(p.stat().st_size // 2)
        b = f.read(1)
        f.seek(p.stat().st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="sha256 mismatch"):
        verify_bundle(bad)


def test_a_killed_generator_pass_resumes_to_the_same_bytes(tmp_path, kb20, encoder, gen, fp32_bundle, monkeypatch):
    calls = {"n": 0}
    real = Generator.chunk_kv

    def dies_on_the_second_batch(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(self, *a, **kw)

    monkeypatch.setattr(Generator, "chunk_kv", dies_on_the_second_batch)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        _build(kb20, out, encoder, gen, memory="fp32", layers="0,14,29")
    assert not out.exists() and len(list(tmp_path.glob(".resumed.partial/gen-*"))) == 1 and 20 > BATCH
    monkeypatch.setattr(Generator, "chunk_kv", real)
    m = _build(kb20, out, encoder, gen, memory="fp32", layers="0,14,29")
    want = verify_bundle(fp32_bundle)["files"]
    assert {k: v for k, v in m["files"].items() if k.startswith("generator/")} == \
        {k: v for k, v in want.items() if k.startswith("generator/")}


def test_a_generator_of_other_weights_is_refused(fp32_bundle, encoder, gen):
    b = load_bundle(fp32_bundle)
    other = Generator(gen.model, gen.tokenizer, name="x")
    object.__setattr__(other, "info", type(gen.info)(**{**gen.info.__dict__, "fingerprint": "0" * 64}))
    with pytest.raises(BundleError, match="other weights"):
        GenEngine(Engine(encoder, b), other)


def test_exact_answers_equal_the_masked_reference_over_the_retrieved_chunks(tmp_path, kb20, encoder, gen):
    """GenEngine with exact: R's K/V recomputed after the prompt's own prefix: the masked concatenation."""
    out = tmp_path / "rc"
    _build(kb20, out, encoder, gen, memory="recompute", layers="all")
    ge = GenEngine(Engine(encoder, load_bundle(out)), gen)
    msgs = [{"role": "user", "content": "How much is an adult single on the Amber Line?"}]
    for positions in ("composite", "reordered"):
        p = GenParams(max_tokens=4, k=3, exact=True, mixing="joint", prior=0.0, positions=positions)
        ans = ge.answer(p, messages=msgs, keep_logits=True)
        prep = ge.prepare(p, None, msgs)
        assert ans.diagnostics["memory_source"] == "recomputed"
        ids = [ge.store.token_ids(r) for r in prep.rows]
        ref = gen.generate_masked_reference(ids, prep.prefix + prep.rest, positions, Sampling(max_tokens=4),
                                            prefix_len=len(prep.prefix))
        assert gen.tokenizer.decode(ref.token_ids, skip_special_tokens=True) == ans.text
        got = ge.last_generation.logits
        assert max(float((a - b).abs().max()) for a, b in zip(got, ref.logits, strict=True)) <= 1e-4
        assert len(ans.evidence) == 3
        assert sum(e.mass_share for e in ans.evidence) == pytest.approx(ans.diagnostics["memory_share"], abs=1e-5)
