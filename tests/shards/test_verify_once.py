"""What each process of a sharded deployment checksums when it opens a bundle: the serving process
the metadata it opens (replica_files), each shard its own bulk files (shard_own_files), every file
once; a corrupt shard file is refused by its shard, named, while the serving process never reads it."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import softknn.storage.layout as layout_mod
from softknn.common.errors import BundleError
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest, replica_files, shard_own_files
from softknn.storage.manifest import Manifest
from softknn.storage.shards import LocalShards, Shard, shard_specs


@pytest.fixture
def checksummed(monkeypatch) -> Counter:
    """Every file sha256_file reads, with how often."""
    seen: Counter = Counter()
    real = layout_mod.sha256_file

    def spy(path, *a, **kw):
        seen[Path(path)] += 1
        return real(path, *a, **kw)

    monkeypatch.setattr(layout_mod, "sha256_file", spy)  # what verify_files reads each file with
    return seen


def _rel(seen: Counter, root: Path) -> Counter:
    return Counter({str(p.relative_to(root)): n for p, n in seen.items()})


def test_the_files_split_between_replica_and_shards(sharded_bundle_path):
    m = Manifest.of(read_manifest(sharded_bundle_path), sharded_bundle_path / "manifest.json")
    rep = replica_files(m)
    own = [f"{sh.dir}/{name}" for sh in m.shards or () for name in shard_own_files(m.memory)]
    assert sorted(rep + own) == sorted(m.files) and not set(rep) & set(own)
    assert {r.split("/", 1)[1] for r in rep if not r.split("/", 1)[1].startswith("lexical/")} == {
        "manifest.json", "chunks.jsonl", "chunk_tokens.npy", "token_spans.npy"}
    assert m.memory == "hidden" and set(shard_own_files(m.memory)) == {"embeddings.npy", "index.faiss", "mem_hidden.npy"}
    assert set(shard_own_files("kv")) == {"embeddings.npy", "index.faiss", "kv_keys.npy", "kv_values.npy"}


def test_in_process_every_file_is_checksummed_once(sharded_bundle_path, checksummed):
    b = load_bundle(sharded_bundle_path)
    b.close()
    assert _rel(checksummed, sharded_bundle_path) == Counter(dict.fromkeys(read_manifest(sharded_bundle_path)["files"], 1))


def test_the_serving_process_checksums_only_what_it_opens(sharded_bundle_path, checksummed):
    """With the shards elsewhere (a factory that opens none here), the serving process reads the
    checksums of its metadata only: no embeddings, index or memory of any shard."""
    m = Manifest.of(read_manifest(sharded_bundle_path), sharded_bundle_path / "manifest.json")
    b = load_bundle(sharded_bundle_path, shard_backend=lambda specs, version: LocalShards([]))
    assert len(b) == m.counts.chunks
    assert _rel(checksummed, sharded_bundle_path) == Counter(dict.fromkeys(replica_files(m), 1))
    checksummed.clear()
    d, lo, v = shard_specs(sharded_bundle_path, m)[1]
    Shard(d, lo, v, verify=True)  # what a shard actor does at every (re)start: its own files only
    assert _rel(checksummed, Path(d)) == Counter(dict.fromkeys(shard_own_files(m.memory), 1))


def test_a_corrupt_shard_file_is_refused_by_its_shard_not_read_by_the_replica(sharded_bundle_path, tmp_path,
                                                                              checksummed, encoder):
    from softknn.params import Settings
    from softknn.service.app import create_app

    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    target = copy / "shard-0001" / "mem_hidden.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    m = Manifest.of(read_manifest(copy), copy / "manifest.json")
    load_bundle(copy, shard_backend=lambda specs, version: LocalShards([]))  # the replica's part: it never reads that file
    assert target not in checksummed
    d, lo, v = shard_specs(copy, m)[1]
    with pytest.raises(BundleError, match=r"shard-0001/mem_hidden\.npy: sha256 mismatch"):
        Shard(d, lo, v, verify=True)
    Shard(*shard_specs(copy, m)[0], verify=True)  # the other shard's files are fine
    with TestClient(create_app(Settings(bundle=copy, model={"threads": 1}), encoder=encoder)) as client:
        for _ in range(600):  # the bundle loads in the background: until its error is reported
            r = client.get("/readyz")
            if "sha256" in r.text or r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 503 and "shard-0001/mem_hidden.npy: sha256 mismatch" in r.text, r.text
