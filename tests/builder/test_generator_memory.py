"""The builder's generator pass: stored K/V equal the generator's own, every representation is
checksummed and verified, a killed pass resumes to the same bytes, and a bundle refuses other weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from softknn.common.errors import BundleError
from softknn.generate.engine import GenEngine, GenParams
from softknn.generate.memory import ChunkKV, GeneratorStore
from softknn.generate.model import Generator, Sampling
from softknn.index_builder.generator_memory import BATCH
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.retrieval.search import Retriever
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import generator_files, verify_bundle


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
        GenEngine(Retriever(b), encoder, other)


def test_exact_answers_equal_the_masked_reference_over_the_retrieved_chunks(tmp_path, kb20, encoder, gen):
    """GenEngine with exact: R's K/V recomputed after the prompt's own prefix: the masked concatenation."""
    out = tmp_path / "rc"
    _build(kb20, out, encoder, gen, memory="recompute", layers="all")
    ge = GenEngine(Retriever(load_bundle(out)), encoder, gen)
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


# --- compact memory: 4- and 2-bit codes, token selection, the LRU tier --------------------------------
def test_bit_codes_round_trip_and_stay_within_half_a_step():
    from softknn.generate.memory import _pack, _unpack, decode_chunk, encode_chunk

    rng = np.random.default_rng(0)
    for bits in (2, 4):
        q = rng.integers(0, 1 << bits, (5, 3, 64))
        assert np.array_equal(_unpack(_pack(q, bits), bits), q)
    kv = rng.standard_normal((9, 2, 2, 3, 64)).astype(np.float32)
    kv[:, :, 0, :, 5] *= 40  # an outlier key channel: per-channel ranges keep it from swamping the others
    for kind, levels in (("q4", 15), ("q2", 3)):
        enc = encode_chunk(kv, kind)
        assert enc["kv"].dtype == np.uint8 and enc["kv"].shape == (9, 2, 2, 3, 64 * (4 if kind == "q4" else 2) // 8)
        got = decode_chunk(kind, enc["kv"], k_range=enc["k_range"][0], v_range=enc["v_range"])
        k_step = (kv[:, :, 0].max(0) - kv[:, :, 0].min(0)) / levels  # (L, nkv, hs) per channel over the chunk
        v_step = (kv[:, :, 1].max(-1) - kv[:, :, 1].min(-1)) / levels  # (n, L, nkv) per token
        assert (np.abs(got[:, :, 0] - kv[:, :, 0]) <= k_step * 0.5 + 2e-3 * np.abs(kv[:, :, 0]).max()).all()
        assert (np.abs(got[:, :, 1] - kv[:, :, 1]) <= v_step[..., None] * 0.5 + 2e-3 * np.abs(kv[:, :, 1]).max()).all()
    for kind in ("fp32", "fp16"):
        assert np.abs(decode_chunk(kind, encode_chunk(kv, kind)["kv"]) - kv).max() <= (0 if kind == "fp32" else 0.05)


def test_token_selection_keeps_the_most_voted_and_their_neighbours_in_order():
    from softknn.generate.memory import select_tokens

    votes = np.array([0.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0])
    # max-pooled over 5: tokens 2..6 carry 9, 9..11 carry 5; ties go to the earlier token
    assert select_tokens(votes, 0.25).tolist() == [2, 3, 4]
    assert select_tokens(votes, 0.5).tolist() == [2, 3, 4, 5, 6, 9]
    assert select_tokens(votes, 1.0).tolist() == list(range(12))
    assert select_tokens(np.ones(3), 0.01).tolist() == [0]  # at least one token


@pytest.fixture(scope="module")
def q2_bundle(tmp_path_factory, kb20, encoder, gen) -> Path:
    out = tmp_path_factory.mktemp("genq2") / "q2"
    cfg = BuildConfig(generator_memory="q2", generator_layers="0,14,29", generator_keep=0.5, calibrate=False)
    build_bundle(kb20, out, cfg, encoder, progress=False, generator=gen)
    return out


def test_a_selected_q2_store_holds_half_the_tokens_at_the_bytes_its_formula_says(q2_bundle, fp32_bundle, gen):
    from softknn.generate.memory import decode_chunk, encode_chunk, select_tokens

    m = verify_bundle(q2_bundle)
    g = m["generator"]
    assert (g["memory"], g["keep"]) == ("q2", 0.5)
    assert set(generator_files("q2", True)) <= set(m["files"])
    store = GeneratorStore(q2_bundle, g, 20)
    n = [len(store.token_ids(r)) for r in range(20)]
    assert [int(store.kv_offsets[r + 1] - store.kv_offsets[r]) for r in range(20)] == [-(-x // 2) for x in n]
    # the measured bytes per token: the formula's, within the .npy headers (≤ 7 files × 128 B)
    assert abs(g["bytes_per_token"] - g["bytes_per_token_formula"]) <= 7 * 128 / g["tokens"] + 0.1
    # a chunk read back = the fp32 chunk's kept tokens through the codec (the plain path)
    row = 3
    votes: list[np.ndarray] = []
    kv = gen.chunk_kv([store.token_ids(row)], [0, 14, 29], prefix=gen.memory_prefix(), votes=votes)[0]
    kept = select_tokens(votes[0], 0.5)
    c = store.decode(row)
    assert c.kept.tolist() == kept.tolist()
    enc = encode_chunk(kv[kept], "q2")
    want = decode_chunk("q2", enc["kv"], k_range=enc["k_range"][0], v_range=enc["v_range"])
    scale = np.abs(want).max()
    assert np.abs(c.kv.numpy() - want).max() <= 0.02 * scale  # batched in the build, alone here: codes may flip


def test_the_lru_serves_hot_chunks_from_ram_within_its_bytes_and_recomputes_what_is_not_stored(q2_bundle, gen, tmp_path,
                                                                                             kb20, encoder):
    g = verify_bundle(q2_bundle)["generator"]
    store = GeneratorStore(q2_bundle, g, 20)
    first = store.chunks([1, 2, 3], lambda rows: pytest.fail("a stored chunk is never recomputed"))
    assert (store.hits, store.misses) == (0, 3)
    again = store.chunks([3, 1], lambda rows: pytest.fail("no recompute"))
    assert (store.hits, store.misses) == (2, 3) and again[0] is first[2] and again[1] is first[0]
    store.clear()  # a cold cache: decoded from the store again, equal to what was decoded before
    cold = store.chunks([1], lambda rows: pytest.fail("no recompute"))
    assert (store.hits, store.misses) == (2, 4) and cold[0] is not first[0] and torch.equal(cold[0].kv, first[0].kv)
    small = GeneratorStore(q2_bundle, g, 20, cache_bytes=first[1].nbytes + first[2].nbytes)
    small.chunks([1, 2, 3], lambda rows: [])
    assert list(small._lru) == [2, 3] and small._lru_bytes == small.cache_bytes  # the least recently used left
    out = tmp_path / "rc"
    m = _build(kb20, out, encoder, gen, memory="recompute", layers="0,14,29")
    rc = GeneratorStore(out, m["generator"], 20)
    asked: list[list[int]] = []

    def recompute(rows):
        asked.append(rows)
        return [ChunkKV(torch.from_numpy(x)) for x in gen.chunk_kv([rc.token_ids(r) for r in rows], [0, 14, 29],
                                                                   prefix=gen.memory_prefix())]

    rc.chunks([5, 6], recompute)
    rc.chunks([6, 5, 7], recompute)
    assert asked == [[5, 6], [7]] and (rc.hits, rc.misses) == (2, 3)


def test_generation_over_a_selected_store_names_spans_of_kept_tokens(q2_bundle, encoder, gen):
    ge = GenEngine(Retriever(load_bundle(q2_bundle)), encoder, gen)
    a = ge.answer(GenParams(max_tokens=6, k=2), messages=[{"role": "user", "content": "How much is a bicycle?"}])
    assert a.diagnostics["memory_source"] == "stored q2" and a.evidence
    for ev in a.evidence:
        kept = ge.store.decode(next(r for r in range(20) if ge.bundle.chunks[r]["chunk_id"] == ev.chunk_id)).kept
        offsets = gen.chunk_offsets(ev.text)
        allowed = {(ev.start + offsets[i][0], ev.start + offsets[i][1]) for i in kept}
        assert all((s.start, s.end) in allowed for s in ev.spans)
