"""`softknn build --shards`: atomic (a failure leaves the old bundle) and resumable (the rerun finishes
with the same bytes), `softknn verify`/`info` on a sharded bundle."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from softknn.bundle import read_manifest, sha256_file, verify_bundle
from softknn.cli import app
from softknn.index_builder.pipeline import BuildConfig, build_bundle


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

    def crash(full, tmp, manifest, lex, n):
        real(full, tmp, manifest, lex, 1 if n == 3 else n)  # writes shards, then dies before the rename
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
