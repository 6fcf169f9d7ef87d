"""`softknn build --shards`: atomic (a failure leaves the old bundle) and resumable (the rerun finishes
with the same bytes), `softknn verify`/`info` on a sharded bundle."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from softknn.cli import app
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.storage.layout import read_manifest, sha256_file, verify_bundle


def test_cli_verify_and_info(sharded_bundle_path, tmp_path):
    r = CliRunner().invoke(app, ["verify", str(sharded_bundle_path)])
    m = read_manifest(sharded_bundle_path)
    assert r.exit_code == 0 and f"{len(m['files'])} files verified in 2 shards" in r.output
    info = json.loads(CliRunner().invoke(app, ["info", str(sharded_bundle_path)]).output)
    assert [s["dir"] for s in info["shards"]] == ["shard-0000", "shard-0001"]
    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    (copy / "shard-0000" / "index.faiss").write_bytes(b"not an index")
    r = CliRunner().invoke(app, ["verify", str(copy)])
    assert r.exit_code != 0 and "shard-0000/index.faiss: size" in r.output


@pytest.mark.slow
def test_failed_sharded_build_is_atomic_and_resumes(encoder, sample_kb, sharded_bundle_path, tmp_path, monkeypatch):
    import softknn.index_builder.sharding as shards

    out = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, out)  # an existing bundle, to be replaced with --force
    old = read_manifest(out)["version_id"]
    real = shards.write_shards

    def crash(full, tmp, manifest, lex, n, **kw):
        real(full, tmp, manifest, lex, 1 if n == 3 else n, **kw)  # writes shards, then dies before the rename
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(shards, "write_shards", crash)
    with pytest.raises(KeyboardInterrupt):
        build_bundle(sample_kb, out, BuildConfig(shards=2), encoder, force=True, progress=False)
    assert verify_bundle(out)["version_id"] == old  # the old bundle, untouched
    assert not list(tmp_path.glob(".b.tmp-*"))  # no half-written bundle left
    assert (tmp_path / ".b.partial").is_dir()  # the encoded batches, kept for the rerun
    monkeypatch.setattr(shards, "write_shards", real)
    m = build_bundle(sample_kb, out, BuildConfig(shards=2), encoder, force=True, progress=False)
    want = read_manifest(sharded_bundle_path)
    assert m["version_id"] == want["version_id"]  # same input, same shards: the same bytes
    assert m["files"] == want["files"]
    for name, f in m["files"].items():
        assert sha256_file(out / name) == f["sha256"], name


@pytest.mark.parametrize("memory", ["hidden-int8", "kv"])
def test_each_shard_s_memory_comes_straight_from_the_batches_as_the_split_of_one_index_files(
        tmp_path, encoder, sample_kb, memory, monkeypatch):
    """A sharded build writes each shard's memory from the encoded batches into the shard's folder and
    builds no whole-KB FAISS index; its shards hold the very bytes of the plain form, the one-index
    bundle's files split by write_shards."""
    from softknn.index_builder import pipeline
    from softknn.index_builder.pipeline import read_chunks
    from softknn.index_builder.sharding import write_shards
    from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
    from softknn.storage.memory_stores import memory_files

    kb = tmp_path / "kb" / "kb.jsonl"
    kb.parent.mkdir()
    kb.write_text("".join((sample_kb / "kb.jsonl").read_text().splitlines(keepends=True)[:48]))
    build_bundle(kb, tmp_path / "one", BuildConfig(memory=memory), encoder, progress=False)
    written, indexed = [], []
    real_memmap, real_index = pipeline.allocated_memmap, pipeline.build_index
    monkeypatch.setattr(pipeline, "allocated_memmap", lambda path, *a: (written.append(path), real_memmap(path, *a))[1])
    monkeypatch.setattr(pipeline, "build_index", lambda *a: (indexed.append(1), real_index(*a))[1])
    build_bundle(kb, tmp_path / "two", BuildConfig(memory=memory, shards=2), encoder, progress=False)
    mem = [p for p in written if p.name in memory_files(memory)]
    assert sorted(p.parent.name for p in mem) == sorted([".shard-0000.tmp", ".shard-0001.tmp"] * (2 if memory == "kv" else 1))
    assert indexed == []  # each shard's index only (sharding.write_shards), none over the whole KB

    m = json.loads((tmp_path / "one" / "manifest.json").read_text())
    lex = LexicalIndex.build([c["text"] for c in read_chunks(tmp_path / "one")], LexicalSpec.from_manifest(m["lexical"]["settings"]))
    (tmp_path / "ref").mkdir()
    write_shards(tmp_path / "one", tmp_path / "ref", m, lex, 2)
    for s in ("shard-0000", "shard-0001"):
        streamed = json.loads((tmp_path / "two" / s / "manifest.json").read_text())["files"]
        split = json.loads((tmp_path / "ref" / s / "manifest.json").read_text())["files"]
        assert streamed == split and any(name in streamed for name in memory_files(memory))
