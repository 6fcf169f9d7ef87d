"""The sharded bundle's memory-mapped chunks (softknn.storage.chunks) against the eager list they replace."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest

from softknn.common.errors import BundleError
from softknn.storage.bundle import load_bundle
from softknn.storage.chunks import ChunkTexts, MappedChunks, eager_chunks
from softknn.storage.layout import read_manifest


def _files(path):
    return [path / s["dir"] / "chunks.jsonl" for s in read_manifest(path)["shards"]]


def test_mapped_equals_eager(sharded_bundle_path, sample_bundle):
    files = _files(sharded_bundle_path)
    eager, by_id = eager_chunks(files)
    mapped = MappedChunks(files)
    assert len(mapped) == len(eager) == len(sample_bundle.chunks) > 0
    assert mapped.shard_lengths() == [sum(1 for _ in open(f, encoding="utf-8")) for f in files]
    assert [mapped[i] for i in range(len(mapped))] == eager == list(mapped) == sample_bundle.chunks
    assert mapped[np.int64(3)] == eager[3]
    assert mapped[-1] == eager[-1] and mapped[-len(eager)] == eager[0]
    assert mapped[2:7] == eager[2:7] and mapped[::-5] == eager[::-5]
    for bad in (len(eager), -len(eager) - 1):
        with pytest.raises(IndexError):
            mapped[bad]
    assert all(mapped.row_of(c["chunk_id"]) == by_id[c["chunk_id"]] == i for i, c in enumerate(eager))
    assert mapped.row_of("no-such-chunk") is None and mapped.row_of("") is None
    texts = ChunkTexts(mapped)
    assert len(texts) == len(eager) and texts[5] == eager[5]["text"] and texts[1:3] == [c["text"] for c in eager[1:3]]
    again = pickle.loads(pickle.dumps(mapped))
    assert again[4] == eager[4] and again.row_of(eager[4]["chunk_id"]) == 4
    assert mapped.resident_bytes() <= 25 * len(mapped) + 64  # offsets (n + 1 per file), hashes, order


def test_the_sharded_bundle_holds_mapped_chunks(sharded_bundle_path, encoder):
    b = load_bundle(sharded_bundle_path, expected_fingerprint=encoder.info.fingerprint)
    eager, by_id = eager_chunks(_files(sharded_bundle_path))
    assert isinstance(b.chunks, MappedChunks) and len(b) == len(eager)
    assert b.chunks[len(eager) // 2] == eager[len(eager) // 2]
    assert all(b.row_of(k) == v for k, v in by_id.items()) and b.row_of("nope") is None


def test_colliding_hashes_are_told_apart(tmp_path, monkeypatch):
    import softknn.storage.chunks as mc

    f = tmp_path / "chunks.jsonl"
    rows = [{"chunk_id": f"c{i}", "text": f"t{i}"} for i in range(6)] + [{"chunk_id": "c2", "text": "dup"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr(mc, "id_hash", lambda s: 7)  # every id one hash
    m = MappedChunks([f])
    _, by_id = eager_chunks([f])
    assert {r["chunk_id"]: m.row_of(r["chunk_id"]) for r in rows} == by_id  # c2: the last row, as the dict
    assert m.row_of("c9") is None


def test_a_last_line_without_newline_and_an_empty_file(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"chunk_id": "x", "text": "1"}\n{"chunk_id": "y", "text": "2"}', encoding="utf-8")
    b.write_bytes(b"")
    m = MappedChunks([b, a, b])
    assert len(m) == 2 and m[1]["chunk_id"] == "y" and m.row_of("y") == 1 and m.shard_lengths() == [0, 2, 0]


@pytest.mark.parametrize("bad", [b"{not json\n", b"\xff\xfe\n", b"[1, 2]\n"])
def test_a_bad_line_is_a_bundle_error_naming_its_file(sharded_bundle_path, tmp_path, bad):
    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    f = _files(copy)[1]
    lines = f.read_bytes().splitlines(keepends=True)
    f.write_bytes(b"".join(lines[:2] + [bad] + lines[3:]))
    with pytest.raises(BundleError, match=r"shard-0001/chunks\.jsonl.*line 3"):
        MappedChunks(_files(copy))
    with pytest.raises(BundleError, match=r"shard-0001/chunks\.jsonl"):
        load_bundle(copy, verify=False)


def test_a_missing_line_is_a_bundle_error(sharded_bundle_path, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    f = _files(copy)[0]
    f.write_bytes(b"".join(f.read_bytes().splitlines(keepends=True)[:-1]))
    with pytest.raises(BundleError, match=r"shard-0000"):
        load_bundle(copy, verify=False)
