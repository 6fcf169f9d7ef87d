"""The encode cache (softknn/index_builder/encode_cache.py, `softknn build --cache DIR`): a KB update
re-encodes only its new and changed chunks, and the bundle it writes is the fresh build's.

- A first build through an empty cache writes the very bytes of a plain build.
- After an update (a record added in front, one changed, one deleted) only the chunks whose text is
  new are encoded; chunks, spans, token counts and the BM25 index equal a fresh build's byte for
  byte; embeddings and memory rows equal it up to the round-off of padding a chunk with other
  neighbours in its batch; the answers name the same evidence.
- The cache keeps only batches the newest build used; a damaged batch is removed and encoded again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from softknn.index_builder.encode_cache import chunk_key
from softknn.index_builder.pipeline import BuildConfig, build_bundle, read_chunks
from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle

N_RECORDS = 48


def _records(sample_kb: Path) -> list[dict]:
    """The first FAQ records and one handbook document of several chunks."""
    with open(sample_kb / "kb.jsonl", encoding="utf-8") as f:
        faq = [json.loads(line) for line in f][:N_RECORDS]
    text = (sample_kb / "handbook" / "02_fleet_and_maintenance.md").read_text(encoding="utf-8")
    return [*faq, {"id": "handbook-02", "text": text, "label": faq[0]["label"], "metadata": {}}]


def _write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _files(bundle: Path) -> dict[str, str]:
    """sha256 of every file; the top manifest's as its JSON without the build's clock time."""
    out = {str(p.relative_to(bundle)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(bundle.rglob("*")) if p.is_file()}
    top = json.loads((bundle / "manifest.json").read_text())
    out["manifest.json"] = json.dumps({k: v for k, v in top.items() if k != "created_at"}, sort_keys=True)
    return out


def _chunks(bundle: Path) -> list[dict]:
    """Every chunk record of a bundle, its shards' in shard order."""
    return [c for f in sorted(bundle.rglob("chunks.jsonl")) for c in read_chunks(f.parent)]


def _update(records: list[dict]) -> list[dict]:
    """A new record in front (every later chunk moves), one text changed, one record deleted."""
    new = {"id": "faq-new", "text": "Bicycles travel free on every Amber Line crossing outside the morning peak; "
                                     "tandems and cargo bikes need a vehicle ticket.",
           "label": records[0]["label"], "metadata": {"section": "Bicycles", "source": "Support FAQ"}}
    changed = dict(records[5], text=records[5]["text"] + " From 1 March the fare rises by 5%.")
    # one word of the handbook's first chunk for another of one token too: its later chunks keep their
    # text one char further on (reused, their spans shifted)
    handbook = dict(records[-1], text=records[-1]["text"].replace("The ", "This ", 1))
    return [new, *records[:5], changed, *records[6:20], *records[21:-1], handbook]


@pytest.fixture(scope="module")
def kbs(tmp_path_factory, sample_kb):
    base = _records(sample_kb)
    root = tmp_path_factory.mktemp("cache-kbs")
    return _write(root / "v1" / "kb.jsonl", base), _write(root / "v2" / "kb.jsonl", _update(base))


def test_a_first_build_through_an_empty_cache_writes_a_plain_build_s_bytes(tmp_path, encoder, kbs):
    v1, _ = kbs
    cfg = BuildConfig(shards=2, memory="hidden-int8")
    plain = build_bundle(v1, tmp_path / "plain", cfg, encoder, progress=False)
    stats: dict = {}
    cached = build_bundle(v1, tmp_path / "cached", cfg, encoder, progress=False, cache=tmp_path / "cache", stats=stats)
    texts = [c["text"] for c in _chunks(tmp_path / "plain")]
    assert len(set(texts)) == len(texts)  # no repeated chunk text: the same batches as a plain build
    assert stats == {"chunks": plain["counts"]["chunks"], "encoded": plain["counts"]["chunks"], "reused": 0,
                     "cache_batches_removed": 0, "cache_batches_damaged": 0}
    assert cached["version_id"] == plain["version_id"]
    assert _files(tmp_path / "cached") == _files(tmp_path / "plain")
    # one folder per model and stored memory: hidden-int8 keeps float32 states, kv its own
    build_bundle(v1, tmp_path / "kv", BuildConfig(memory="kv"), encoder, progress=False, cache=tmp_path / "cache")
    folders = sorted(p for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert [json.loads((p / "settings.json").read_text())["stored"] for p in folders] \
        in (["hidden-float32", "kv-float32"], ["kv-float32", "hidden-float32"])


@pytest.mark.parametrize("memory,shards", [("hidden-int8", 2), ("kv", 1)])
def test_an_update_encodes_only_its_new_chunks_and_answers_as_a_fresh_build(tmp_path, encoder, kbs, memory, shards):
    v1, v2 = kbs
    cfg = BuildConfig(shards=shards, memory=memory)
    cache = tmp_path / "cache"
    build_bundle(v1, tmp_path / "b1", cfg, encoder, progress=False, cache=cache)
    stats: dict = {}
    build_bundle(v2, tmp_path / "b2", cfg, encoder, progress=False, cache=cache, stats=stats)
    fresh = build_bundle(v2, tmp_path / "fresh", cfg, encoder, progress=False)

    old = {c["text"] for c in _chunks(tmp_path / "b1")}
    new_texts = [c["text"] for c in _chunks(tmp_path / "fresh") if c["text"] not in old]
    assert len(new_texts) == 3  # the added record's, the changed record's, the handbook's first chunk
    moved = {c["text"]: c["start"] for c in _chunks(tmp_path / "b1") if c["doc_id"] == "handbook-02"}
    shifted = [c for c in _chunks(tmp_path / "fresh") if c["text"] in moved and c["start"] != moved[c["text"]]]
    assert len(shifted) >= 2  # reused chunks at a new place in their document
    assert stats["encoded"] == len(set(new_texts)) and stats["reused"] == fresh["counts"]["chunks"] - len(new_texts)

    f_cached, f_fresh = _files(tmp_path / "b2"), _files(tmp_path / "fresh")
    assert f_cached.keys() == f_fresh.keys()
    float_files = ("embeddings.npy", "kv_keys.npy", "kv_values.npy", "mem_hidden.npy", "mem_hidden_scale.npy",
                   "index.faiss", "manifest.json")
    for name, digest in f_fresh.items():  # everything but the floats (and what is built from them) is the same bytes
        if Path(name).name not in float_files:
            assert f_cached[name] == digest, name
    for name in f_fresh:
        p = Path(name)
        if p.suffix == ".npy" and p.name in float_files:
            a = np.load(tmp_path / "b2" / name).astype(np.float64)
            b = np.load(tmp_path / "fresh" / name).astype(np.float64)
            assert a.shape == b.shape, name
            # float32 round-off of another batch padding (embeddings at unit scale; K/V relative to their
            # scale); int8 codes may differ by one step where a value sits on a rounding boundary
            tol = 1.0 if memory == "hidden-int8" and p.name == "mem_hidden.npy" else 2e-5 * max(1.0, np.abs(b).max())
            assert np.abs(a - b).max() <= tol, (name, np.abs(a - b).max())

    e_cached, e_fresh = (Engine(encoder, load_bundle(b, expected_fingerprint=encoder.info.fingerprint))
                         for b in (tmp_path / "b2", tmp_path / "fresh"))
    queries = ["can I bring my bicycle on the ferry?", "how much is a child's fare?", "refund for a cancelled sailing"]
    for mode in ("dense", "hybrid"):
        p = InferParams(retrieval=mode)
        for a, b in zip(e_cached.infer(queries, p), e_fresh.infer(queries, p), strict=True):
            assert [ev.chunk_id for ev in a.evidence] == [ev.chunk_id for ev in b.evidence]
            assert np.abs(np.asarray(a.embedding) - np.asarray(b.embedding)).max() <= 1e-4


def _flip(path: Path, at: int, bits: int, used: set[bytes]) -> int:
    """Damage one byte of a cache batch's file; returns how many chunks of `used` that batch holds."""
    n = sum(k.tobytes() in used for k in np.load(path.parent / "chunk_keys.npy"))
    raw = bytearray(path.read_bytes())
    raw[at] ^= bits
    path.write_bytes(bytes(raw))
    return n


def test_the_cache_keeps_what_the_newest_build_used_and_encodes_a_damaged_batch_again(tmp_path, encoder, kbs):
    v1, v2 = kbs
    cfg = BuildConfig(memory="hidden")
    cache = tmp_path / "cache"
    build_bundle(v1, tmp_path / "b1", cfg, encoder, progress=False, cache=cache)
    build_bundle(v2, tmp_path / "b2", cfg, encoder, progress=False, cache=cache)
    used = {chunk_key(c["text"]) for c in read_chunks(tmp_path / "b2")}
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    batches = sorted(folder.glob("batch-*"))
    for d in batches:  # every batch left holds a chunk of the newest build
        keys = np.load(d / "chunk_keys.npy")
        assert keys.dtype == np.uint8 and keys.shape[1] == 32
        assert any(k.tobytes() in used for k in keys)
    # the same KB again: nothing to encode, the same bytes
    stats: dict = {}
    build_bundle(v2, tmp_path / "again", cfg, encoder, progress=False, cache=cache, stats=stats)
    assert (stats["encoded"], stats["cache_batches_damaged"]) == (0, 0)
    assert _files(tmp_path / "again") == _files(tmp_path / "b2")
    # one byte of one batch's states flipped: that batch is dropped and its chunks encoded again
    n_victim = _flip(batches[0] / "hidden.npy", -3, 0x40, used)
    stats = {}
    build_bundle(v2, tmp_path / "repaired", cfg, encoder, progress=False, cache=cache, stats=stats)
    assert stats["cache_batches_damaged"] == 1 and stats["encoded"] == n_victim > 0
    e = np.load(tmp_path / "repaired" / "mem_hidden.npy")
    assert np.abs(e - np.load(tmp_path / "b2" / "mem_hidden.npy")).max() <= 2e-5 * max(1.0, float(np.abs(e).max()))
    # a batch's key file damaged: refused when the cache is opened, its chunks encoded again
    n_victim = _flip(sorted(folder.glob("batch-*"))[-1] / "chunk_keys.npy", -1, 0x01, used)
    stats = {}
    build_bundle(v2, tmp_path / "rekeyed", cfg, encoder, progress=False, cache=cache, stats=stats)
    assert stats["cache_batches_damaged"] == 1 and stats["encoded"] == n_victim > 0
    stats = {}
    build_bundle(v2, tmp_path / "settled", cfg, encoder, progress=False, cache=cache, stats=stats)
    assert (stats["cache_batches_damaged"], stats["encoded"]) == (0, 0)


def test_the_cli_builds_through_the_cache_and_says_what_it_encoded(tmp_path, kbs):
    from softknn.cli import app

    v1, v2 = kbs
    runner = CliRunner()
    args = ["build", "--cache", str(tmp_path / "cache"), "--no-progress", "--force"]
    r1 = runner.invoke(app, [*args, str(v1.parent), "--out", str(tmp_path / "b1")])
    assert r1.exit_code == 0, r1.output
    r2 = runner.invoke(app, [*args, str(v2.parent), "--out", str(tmp_path / "b2")])
    assert r2.exit_code == 0, r2.output
    n = len(read_chunks(tmp_path / "b2"))
    encoded = int(r2.output.split("encode cache ")[1].split(": ")[1].split(" chunks encoded")[0])
    assert encoded == 3
    assert f"{encoded} chunks encoded, {n - encoded} reused" in r2.output


def test_a_cache_path_that_is_not_a_folder_is_refused_before_the_model_loads(tmp_path, kbs):
    from softknn.cli import app

    v1, _ = kbs
    (tmp_path / "file").write_text("x")
    r = CliRunner().invoke(app, ["build", str(v1.parent), "--out", str(tmp_path / "b"), "--cache", str(tmp_path / "file")])
    assert r.exit_code == 2, r.output  # softknn's usage errors exit 2
    assert f"error: --cache {tmp_path / 'file'}: not a folder" in r.output
    assert not (tmp_path / "b").exists()
