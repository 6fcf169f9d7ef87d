"""Bundles served from object storage (softknn.storage.remote), against moto's S3 server on this machine
(a real HTTP S3 endpoint; s3fs reads it through AWS_ENDPOINT_URL, as it would MinIO or AWS):
`softknn push` uploads, a serving process fetches only what it opens into its node-local cache, a
shard fetches its own directory, a corrupt or half-uploaded object is refused and never cached, and
the answers equal the local bundle's."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from softknn.common.errors import BundleError
from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import MANIFEST, read_manifest
from tests.shards.test_sharded import QUERIES

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
PARAMS = InferParams(exact=True, k=8)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port, the AWS_* environment pointing at it (for this process and
    the Ray cluster this module starts after it), and a fresh node-local cache."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}",
           "SOFTKNN_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("kbs")
    yield fs
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def _push(bundle, uri: str) -> None:
    r = CliRunner().invoke(_app(), ["push", str(bundle), uri])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"ok: {bundle} → {uri}, "), r.output


def _app():
    from softknn.cli import app

    return app


def _answers(encoder, path) -> list[dict]:
    b = load_bundle(path, expected_fingerprint=encoder.info.fingerprint)
    try:
        return [r.to_dict() for r in Engine(encoder, b).infer(QUERIES[:3], PARAMS)]
    finally:
        close = getattr(b, "close", None)
        if close is not None:
            close()


def _same(got: list[dict], want: list[dict]) -> None:
    for a, b in zip(got, want, strict=True):
        assert np.abs(np.asarray(a["embedding"]) - np.asarray(b["embedding"])).max() <= 1e-6
        assert [e["chunk_id"] for e in a["evidence"]] == [e["chunk_id"] for e in b["evidence"]]


def _cached_files(d) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def test_an_unsharded_bundle_pushed_fetched_and_served_equals_the_local_one(s3, encoder, sample_bundle_path):
    from softknn.storage.remote import SOURCE, localize

    _push(sample_bundle_path, "s3://kbs/sample")
    m = read_manifest(sample_bundle_path)
    assert set(s3.find("kbs/sample")) == {f"kbs/sample/{n}" for n in [*m["files"], MANIFEST]}
    local = localize("s3://kbs/sample")
    assert local.name == m["version_id"]
    assert _cached_files(local) == {*m["files"], MANIFEST, SOURCE}
    assert json.loads((local / SOURCE).read_text()) == {"uri": "s3://kbs/sample"}
    assert read_manifest(local) == m
    _same(_answers(encoder, local), _answers(encoder, sample_bundle_path))
    # a second open is served from the cache: it reads only the manifest from the store
    s3.rm("kbs/sample/embeddings.npy")
    assert localize("s3://kbs/sample") == local
    s3.put_file(str(sample_bundle_path / "embeddings.npy"), "kbs/sample/embeddings.npy")


def test_a_corrupt_or_truncated_object_is_refused_and_never_cached(s3, sample_bundle_path, tmp_path):
    from softknn.storage.remote import cache_root, localize

    _push(sample_bundle_path, "s3://kbs/bad")
    d = cache_root() / read_manifest(sample_bundle_path)["version_id"]

    def refused(match: str) -> None:
        shutil.rmtree(d, ignore_errors=True)  # the copy test 1 left (the same version)
        with pytest.raises(BundleError, match=match):
            localize("s3://kbs/bad")
        assert not (d / "chunks.jsonl").exists() and not (d / MANIFEST).exists()  # nothing half-written
        assert not [p for p in d.rglob("*") if ".part-" in p.name]

    good = (sample_bundle_path / "chunks.jsonl").read_bytes()
    s3.pipe_file("kbs/bad/chunks.jsonl", bytes([good[0] ^ 1]) + good[1:])  # same size, one bit off
    refused(r"s3://kbs/bad/chunks.jsonl: sha256 mismatch")
    s3.pipe_file("kbs/bad/chunks.jsonl", good[:-10])  # an upload cut short
    refused(rf"s3://kbs/bad/chunks.jsonl: size {len(good) - 10} != manifest {len(good)}")
    s3.pipe_file("kbs/bad/chunks.jsonl", good)
    s3.rm("kbs/bad/index.faiss")
    refused(r"s3://kbs/bad/index.faiss: missing from the store")
    with pytest.raises(BundleError, match=r"s3://kbs/nothing: not a bundle \(no manifest.json\)"):
        localize("s3://kbs/nothing")


def test_a_sharded_bundle_fetches_metadata_here_and_each_shard_its_own_files(s3, encoder, sharded_bundle_path):
    from softknn.storage.layout import replica_files, shard_own_files
    from softknn.storage.remote import SOURCE, cache_root, localize
    from softknn.storage.shards import shard_specs

    _push(sharded_bundle_path, "s3://kbs/sharded")
    m = read_manifest(sharded_bundle_path)
    local = localize("s3://kbs/sharded")
    from softknn.storage.manifest import Manifest

    typed = Manifest.of(m, "m")
    assert _cached_files(local) == {*replica_files(typed), MANIFEST, SOURCE}  # no shard's bulk files
    assert [s[0] for s in shard_specs(local, typed)] == [f"s3://kbs/sharded/{sh['dir']}" for sh in m["shards"]]
    _same(_answers(encoder, local), _answers(encoder, sharded_bundle_path))  # in-process shards fetch theirs
    for sh in m["shards"]:
        d = cache_root() / "shards" / sh["version_id"]
        assert set(shard_own_files(typed.memory)) <= _cached_files(d)
        assert read_manifest(d)["version_id"] == sh["version_id"]


def test_the_service_serves_a_uri_and_refuses_writes_into_its_cache(s3, encoder, sample_bundle_path):
    from fastapi.testclient import TestClient

    from softknn.params import Settings
    from softknn.service.app import create_app
    from tests.harness import wait_ready

    _push(sample_bundle_path, "s3://kbs/served")
    version = read_manifest(sample_bundle_path)["version_id"]
    settings = Settings(bundle="s3://kbs/served", model={"threads": 1}, auth={"admin_token": "t"})
    assert settings.bundle == "s3://kbs/served"
    with TestClient(create_app(settings, encoder=encoder)) as c:
        wait_ready(c, 120)
        r = c.post("/v1/infer", json={"inputs": QUERIES[:3], "exact": True, "k": 8})
        assert r.status_code == 200 and r.json()["bundle_version"] == version
        _same(r.json()["results"], _answers(encoder, sample_bundle_path))
        r = c.put("/v1/documents/new-1", json={"text": "A new ferry timetable starts in May."},
                  headers={"Authorization": "Bearer t"})
        assert r.status_code == 409 and r.json()["error"]["type"] == "write_refused", r.text
        assert "cached copy of s3://kbs/served" in r.json()["error"]["message"]
        r = c.post("/v1/admin/reload", json={"bundle": "s3://kbs/missing"}, headers={"Authorization": "Bearer t"})
        assert r.status_code == 422, r.text
        assert r.json()["error"] == {"type": "bundle_error", "field": "bundle",
                                     "message": "s3://kbs/missing: not a bundle (no manifest.json)"}
        r = c.post("/v1/admin/reload", json={"bundle": "s3://kbs/served"}, headers={"Authorization": "Bearer t"})
        assert r.status_code == 200 and r.json()["bundle_version"] == version, r.text


def test_fetch_prints_the_cached_copy_and_push_refuses_a_path(s3, sharded_bundle_path):
    from softknn.storage.remote import cache_root

    _push(sharded_bundle_path, "s3://kbs/cli")
    m = read_manifest(sharded_bundle_path)
    r = CliRunner().invoke(_app(), ["fetch", "s3://kbs/cli", "--shards"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(cache_root() / m["version_id"])
    for sh in m["shards"]:
        assert (cache_root() / "shards" / sh["version_id"] / "index.faiss").is_file()
    r = CliRunner().invoke(_app(), ["push", str(sharded_bundle_path), "/tmp/somewhere"])
    assert r.exit_code != 0 and "/tmp/somewhere: not a URI" in r.output


@pytest.mark.slow
def test_ray_shards_fetch_their_own_directories_and_answer_exactly(s3, ray_cluster, encoder, sharded_bundle_path):
    """`serve --ray --bundle s3://…`: the coordinator reads the manifest from the store, each shard
    actor fetches its directory to its node, the replica the metadata; answers equal the local bundle's."""
    import httpx
    from ray import serve

    from softknn.params import Settings
    from softknn.service.ray.launcher import kill_named_shards, serve_ray
    from tests.harness import free_port, wait_ready

    _push(sharded_bundle_path, "s3://kbs/ray")
    version = read_manifest(sharded_bundle_path)["version_id"]
    port = free_port()
    serve_ray(Settings(bundle="s3://kbs/ray", port=port, model={"threads": 1}), blocking=False,
              replicas=1, replica_cpus=0.5, shard_cpus=0.5)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            wait_ready(c, 600, interval=1, probe_timeout=30)
            r = c.post("/v1/infer", json={"inputs": QUERIES[:3], "exact": True, "k": 8})
            assert r.status_code == 200 and r.json()["bundle_version"] == version, r.text
            _same(r.json()["results"], _answers(encoder, sharded_bundle_path))
    finally:
        serve.shutdown()
        kill_named_shards()


def test_a_push_over_the_served_uri_is_refused_by_a_shard_never_served(s3, encoder, sample_kb, sharded_bundle_path,
                                                                       tmp_path):
    """A new build pushed over the URI a deployment serves (instead of to a new prefix): a shard that
    (re)starts then finds another version under its URI and refuses it, as after a rebuild in place."""
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.storage.remote import cache_root
    from softknn.storage.shards import Shard, shard_specs

    _push(sharded_bundle_path, "s3://kbs/inplace")
    from softknn.storage.manifest import Manifest

    old = Manifest.of(read_manifest(sharded_bundle_path), "m")
    spec = shard_specs("s3://kbs/inplace", old)[0]
    kb = tmp_path / "kb"
    shutil.copytree(sample_kb, kb)
    lines = (kb / "kb.jsonl").read_text()
    (kb / "kb.jsonl").write_text('{"id": "faq-0000", "text": "The harbour office opens at 07:00 on weekdays.", '
                                 '"label": "tickets_and_fares"}\n' + lines)
    build_bundle(kb, tmp_path / "new", BuildConfig(shards=2), encoder, progress=False)
    _push(tmp_path / "new", "s3://kbs/inplace")
    shutil.rmtree(cache_root() / "shards", ignore_errors=True)
    with pytest.raises(BundleError, match=rf"holds shard version \w+, but this shard was opened for {spec[2]}"):
        Shard(spec[0], spec[1], spec[2], verify=True)


def test_the_cache_keeps_the_newest_versions_and_an_evicted_one_still_serves(s3, encoder, sample_bundle_path,
                                                                              sharded_bundle_path, monkeypatch):
    """SOFTKNN_CACHE_KEEP=1: opening a second version removes the first from the cache; a process
    that has the first open keeps answering from it (its files stay mapped); opening it again
    fetches it again."""
    from softknn.storage.remote import localize

    _push(sample_bundle_path, "s3://kbs/keep-a")
    _push(sharded_bundle_path, "s3://kbs/keep-b")
    want = _answers(encoder, sample_bundle_path)
    monkeypatch.setenv("SOFTKNN_CACHE_KEEP", "1")
    a = localize("s3://kbs/keep-a")
    served = load_bundle(a, expected_fingerprint=encoder.info.fingerprint)
    b = localize("s3://kbs/keep-b")
    assert not a.exists() and b.is_dir()
    _same([r.to_dict() for r in Engine(encoder, served).infer(QUERIES[:3], PARAMS)], want)
    assert localize("s3://kbs/keep-a") == a and a.is_dir() and not b.exists()
    _same(_answers(encoder, a), want)


def test_build_out_a_uri_pushes_the_same_bundle_and_leaves_no_staging_folder(s3, encoder, sample_kb,
                                                                             sharded_bundle_path):
    """`softknn build KB --out s3://…`: built beside the node's cache, pushed, the folder removed; the
    store then holds the bundle a local build of the same KB writes (same version id, same answers),
    and a second build to the same URI is refused without --force before any model loads."""
    from softknn.storage.remote import cache_root, fetch, localize, read_remote_manifest

    version = read_manifest(sharded_bundle_path)["version_id"]
    r = CliRunner().invoke(_app(), ["build", str(sample_kb), "--out", "s3://kbs/built", "--shards", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"built s3://kbs/built: version {version}, "), r.output
    assert read_remote_manifest("s3://kbs/built")["version_id"] == version
    assert not list(cache_root().glob(".build-*"))  # the staging folder is gone
    local = localize("s3://kbs/built")
    for sh in read_manifest(local)["shards"]:
        fetch(f"s3://kbs/built/{sh['dir']}")
    _same(_answers(encoder, local), _answers(encoder, sharded_bundle_path))

    again = CliRunner().invoke(_app(), ["build", str(sample_kb), "--out", "s3://kbs/built", "--no-progress"])
    assert again.exit_code == 2
    assert "s3://kbs/built: already holds a bundle; pass --force to replace it" in again.output
    assert read_remote_manifest("s3://kbs/built")["version_id"] == version
    assert not list(cache_root().glob(".build-*"))
