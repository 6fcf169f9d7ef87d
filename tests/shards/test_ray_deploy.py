"""`serve_ray`'s deployment as a team runs it: a shard pinned to the bundle version it was created for
(a rebuild in place and a shard restart never give a wrong answer), readiness that sees a dead shard,
reloads that reach every replica and free the old shard actors, and a reload that cannot place its
shards failing with a clear error.

One module-scoped local Ray cluster of 4 logical CPUs; each test starts its own Serve application
(softknn.service.ray.launcher.serve_ray, blocking=False) and shuts it down (serve.shutdown, then its named
actors)."""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import pytest

from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest
from tests.harness import ADMIN_TOKEN, LiveServer, free_port, wait_ready
from tests.shards.test_sharded import QUERIES

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REQUEST = {"inputs": QUERIES[:2], "exact": True, "k": 8}


@pytest.fixture(scope="module")
def kb3(sample_kb, tmp_path_factory):
    """The sample KB with one record prepended: every row of the KB moves down by one."""
    out = tmp_path_factory.mktemp("kb3") / "kb"
    shutil.copytree(sample_kb, out)
    lines = (out / "kb.jsonl").read_text().splitlines(keepends=True)
    first = ('{"id": "faq-0000", "text": "The harbour office in Saltbridge opens at 07:00 on weekdays.", '
             '"label": "tickets_and_fares", "metadata": {"section": "Offices", "source": "Support FAQ"}}\n')
    (out / "kb.jsonl").write_text(first + "".join(lines))
    return out


@pytest.fixture(scope="module")
def kb3_bundle_path(kb3, encoder, tmp_path_factory):
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    out = tmp_path_factory.mktemp("kb3b") / "b"
    build_bundle(kb3, out, BuildConfig(shards=2), encoder, progress=False)
    return out


def _settings(bundle, port):
    from softknn.params import Settings

    return Settings(bundle=bundle, port=port, model={"threads": 1}, limits={"max_k": 512},
                    auth={"admin_token": ADMIN_TOKEN})


def _answers(encoder, bundle_path) -> list[dict]:
    b = load_bundle(bundle_path, expected_fingerprint=encoder.info.fingerprint)  # in this process
    return [r.to_dict() for r in Engine(encoder, b).infer(REQUEST["inputs"], InferParams(exact=True, k=8))]


def _same(got: list[dict], want: list[dict]) -> bool:
    return all(np.abs(np.asarray(a["embedding"]) - np.asarray(b["embedding"])).max() <= 1e-6
               and [e["chunk_id"] for e in a["evidence"]] == [e["chunk_id"] for e in b["evidence"]]
               for a, b in zip(got, want, strict=True))


class Deployment:
    """serve_ray(…, blocking=False) on this module's cluster, an httpx client to it, and its shutdown."""

    def __init__(self, bundle, **opts):
        from softknn.service.ray.launcher import serve_ray

        self.port = free_port()
        serve_ray(_settings(bundle, self.port), blocking=False, **opts)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=300)
        wait_ready(self.client, 600, interval=1, probe_timeout=30)

    def close(self) -> None:
        from ray import serve

        from softknn.service.ray.launcher import kill_named_shards

        self.client.close()
        serve.shutdown()
        kill_named_shards()


@pytest.fixture
def deploy(ray_cluster):
    made: list[Deployment] = []

    def start(bundle, **opts) -> Deployment:
        made.append(Deployment(bundle, **opts))
        return made[-1]

    yield start
    for d in made:
        d.close()


def _shard_names() -> list[str]:
    from softknn.storage.ray_shards import shard_actor_names

    return shard_actor_names()


def _wait_names(want: list[str], timeout: float = 60.0) -> list[str]:
    """The named shard actors, once they are `want` (the old set is freed a few seconds after a swap)."""
    end = time.monotonic() + timeout
    while (names := _shard_names()) != want and time.monotonic() < end:
        time.sleep(0.5)
    return names


def test_rebuild_in_place_and_a_shard_restart_never_answer_wrong(deploy, sharded_bundle_path, kb3, encoder,
                                                                 tmp_path):
    """Serve DIR; rebuild DIR in place (one record prepended: every row moves); kill shard 0's actor
    (Ray restarts it, on the new files). Every 200 is the old bundle's answer with the old version;
    the restarted shard refuses the new files, so the rest are 503; /readyz names shard 0; a reload
    serves the new bundle, exactly."""
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    cur = tmp_path / "cur"
    shutil.copytree(sharded_bundle_path, cur)
    old_version = read_manifest(cur)["version_id"]
    want_old = _answers(encoder, cur)
    d = deploy(cur, replicas=1, replica_cpus=0.5, shard_cpus=0.5)
    c = d.client
    r = c.post("/v1/infer", json=REQUEST)
    assert r.status_code == 200 and r.json()["bundle_version"] == old_version
    assert r.headers.get_list("x-request-id") == [r.headers["x-request-id"]]  # one header, not two
    build_bundle(kb3, cur, BuildConfig(shards=2), encoder, force=True, progress=False)
    new_version = read_manifest(cur)["version_id"]
    assert new_version != old_version
    names = _shard_names()
    ray.kill(ray.get_actor(names[0], namespace="softknn"), no_restart=False)  # SIGKILL-like; Ray restarts it
    statuses = []
    for _ in range(20):
        r = c.post("/v1/infer", json=REQUEST)
        statuses.append(r.status_code)
        if r.status_code == 200:
            body = r.json()
            assert body["bundle_version"] == old_version
            assert _same(body["results"], want_old), "a 200 that is not the served bundle's answer"
        else:
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] in ("shard_unavailable", "shard_version_mismatch"), r.text
        time.sleep(0.2)
    assert statuses[-1] == 503  # the restarted shard refused the rebuilt files: no answer without it
    ready = c.get("/readyz")
    assert ready.status_code == 503, ready.text
    msg = ready.json()["error"]["message"]
    assert "shard 0 (shard-0000)" in msg and "gone for good" in msg and "rebuilt in place" in msg, msg
    assert "shard 1" not in msg, msg
    r = c.post("/v1/admin/reload", json={"bundle": str(cur)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["bundle_version"] == new_version and r.json()["previous_version"] == old_version
    assert c.get("/readyz").status_code == 200
    r = c.post("/v1/infer", json=REQUEST)
    assert r.status_code == 200 and r.json()["bundle_version"] == new_version
    assert _same(r.json()["results"], _answers(encoder, cur))


def test_a_dead_shard_makes_readyz_not_ready_and_a_reload_repairs(deploy, sharded_bundle_path):
    """A shard actor killed for good: /readyz 503 naming it (not "ready" while every request 503s);
    a reload of the same bundle starts a new shard set, /readyz is 200, and the old set is freed."""
    d = deploy(sharded_bundle_path, replicas=1, replica_cpus=0.5, shard_cpus=0.5)
    c = d.client
    version = read_manifest(sharded_bundle_path)["version_id"]
    before = _shard_names()
    assert before == [f"softknn-shard-{version}-g0-0", f"softknn-shard-{version}-g0-1"]
    ray.kill(ray.get_actor(before[1], namespace="softknn"), no_restart=True)
    ready = c.get("/readyz")
    assert ready.status_code == 503, ready.text
    msg = ready.json()["error"]["message"]
    assert "shard 1 (shard-0001) is gone for good" in msg and "/v1/admin/reload" in msg, msg
    r = c.post("/v1/infer", json=REQUEST)
    assert r.status_code == 503 and r.json()["error"]["type"] == "shard_unavailable", r.text
    r = c.post("/v1/admin/reload", json={"bundle": str(sharded_bundle_path)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["bundle_version"] == version
    assert c.get("/readyz").status_code == 200
    assert c.post("/v1/infer", json=REQUEST).status_code == 200
    want = [f"softknn-shard-{version}-g1-0", f"softknn-shard-{version}-g1-1"]
    assert _wait_names(want) == want  # the old set (shard 0 alive until now) is gone


def test_reload_with_two_replicas_reaches_both_and_frees_the_old_shards(deploy, sharded_bundle_path,
                                                                        kb3_bundle_path):
    """--replicas 2: one reload swaps both replicas and the shard set; every answer after it carries
    the new version; the old shard actors are killed once both replicas have swapped."""
    old, new = (read_manifest(p)["version_id"] for p in (sharded_bundle_path, kb3_bundle_path))
    d = deploy(sharded_bundle_path, replicas=2, replica_cpus=0.5, shard_cpus=0.5)
    c = d.client
    first = [c.post("/v1/infer", json=REQUEST) for _ in range(6)]
    assert [r.status_code for r in first] == [200] * 6, [r.text for r in first if r.status_code != 200]
    assert {r.json()["bundle_version"] for r in first} == {old}
    r = c.post("/v1/admin/reload", json={"bundle": str(kb3_bundle_path)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert (r.json()["bundle_version"], r.json()["previous_version"]) == (new, old)
    versions = [c.post("/v1/infer", json=REQUEST).json()["bundle_version"] for _ in range(20)]
    assert versions == [new] * 20
    want = [f"softknn-shard-{new}-g1-0", f"softknn-shard-{new}-g1-1"]
    assert _wait_names(want) == want


def test_reload_that_cannot_place_its_shards_fails_and_the_old_one_serves(deploy, sharded_bundle_path,
                                                                          kb3_bundle_path):
    """1 replica + 2 shards of one CPU each on 4 CPUs: a second shard set has room for one shard only.
    The reload fails within its placement deadline (503 shards_not_placed, naming what is free), the
    half-placed new set is killed, and the old bundle keeps serving."""
    old = read_manifest(sharded_bundle_path)["version_id"]
    d = deploy(sharded_bundle_path, replicas=1, replica_cpus=1, shard_cpus=1, place_timeout_s=5)
    c = d.client
    before = _shard_names()
    t0 = time.monotonic()
    r = c.post("/v1/admin/reload", json={"bundle": str(kb3_bundle_path)}, headers=ADMIN)
    assert time.monotonic() - t0 < 120
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "shards_not_placed" and "found no room in the cluster within 5 s" in err["message"], err
    assert "CPU 1" in err["message"], err
    r = c.post("/v1/infer", json=REQUEST)
    assert r.status_code == 200 and r.json()["bundle_version"] == old
    assert _wait_names(before) == before
    assert c.get("/readyz").status_code == 200


def test_reload_on_the_default_local_cluster_returns(sharded_bundle_path, kb3_bundle_path, tmp_path):
    """`softknn serve --bundle DIR --ray` on the local cluster it starts itself (no --address): its
    CPUs hold a reload's second shard set, so the reload returns with the new version."""
    port = free_port()
    srv = LiveServer.spawn([*LiveServer.command(sharded_bundle_path, port), "--ray"], tmp_path / "serve.log",
                           port=port, env={"HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1",
                                           "SOFTKNN_AUTH__ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        srv.wait_ready(600, interval=1)
        new = read_manifest(kb3_bundle_path)["version_id"]
        r = srv.client.post("/v1/admin/reload", json={"bundle": str(kb3_bundle_path)}, headers=ADMIN, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["bundle_version"] == new
        assert srv.client.post("/v1/infer", json=REQUEST).json()["bundle_version"] == new
    finally:
        srv.close()


def test_replicated_shards_survive_a_lost_copy_and_reload_as_a_set(deploy, sharded_bundle_path, encoder):
    """--shard-replicas 2: two named actors per shard; one killed for good leaves /readyz 200 naming the
    lost copy under `degraded`, and every answer exact; a reload starts a new set of four and frees the
    old one with its placement groups."""
    version = read_manifest(sharded_bundle_path)["version_id"]
    d = deploy(sharded_bundle_path, replicas=1, replica_cpus=0.5, shard_cpus=0.25, shard_replicas=2)
    c = d.client
    names = [f"softknn-shard-{version}-g0-{s}-c{k}" for s in (0, 1) for k in (0, 1)]
    assert _shard_names() == names
    live = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert sorted(g["name"] for g in live) == [f"{names[0]}-pg", f"{names[2]}-pg"]
    want = _answers(encoder, sharded_bundle_path)
    ray.kill(ray.get_actor(names[3], namespace="softknn"), no_restart=True)
    for _ in range(6):
        r = c.post("/v1/infer", json=REQUEST)
        assert r.status_code == 200 and _same(r.json()["results"], want), r.text
    ready = c.get("/readyz")
    assert ready.status_code == 200, ready.text
    degraded = ready.json()["degraded"]
    assert len(degraded) == 1 and degraded[0].startswith("shard 1 (shard-0001) copy 1 is gone for good"), degraded
    r = c.post("/v1/admin/reload", json={"bundle": str(sharded_bundle_path)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    new = [n.replace("-g0-", "-g1-") for n in names]
    assert _wait_names(new) == new
    end = time.monotonic() + 60
    while time.monotonic() < end:
        live = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
        if sorted(live) == [f"{new[0]}-pg", f"{new[2]}-pg"]:
            break
        time.sleep(0.5)
    assert sorted(live) == [f"{new[0]}-pg", f"{new[2]}-pg"]
    assert "degraded" not in c.get("/readyz").json()
    r = c.post("/v1/infer", json=REQUEST)
    assert r.status_code == 200 and _same(r.json()["results"], want)


def test_serve_ray_exits_when_the_cluster_does_not_reach_wait_nodes(sharded_bundle_path, tmp_path):
    """--wait-nodes 2 on the one-node local cluster: exit 2 with the reason on stderr after the timeout,
    before any shard actor is placed (they would all land on the nodes that are there)."""
    import os
    import subprocess
    import sys

    from tests.harness import REPO

    r = subprocess.run([sys.executable, "-m", "softknn.service.cli", "--bundle", str(sharded_bundle_path), "--ray",
                        "--wait-nodes", "2", "--wait-nodes-timeout", "2", "--port", str(free_port())],
                       capture_output=True, text=True, cwd=REPO, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1"})
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert lines == ["error: the Ray cluster has 1 live node(s) after 2 s, --wait-nodes asks for 2: start the "
                     "workers, or lower --wait-nodes"], r.stderr[-3000:]


def test_the_haproxy_ingress_answers_as_the_python_proxy_and_leaves_no_process(sharded_bundle_path, encoder,
                                                                               tmp_path):
    """`softknn serve --ray --ingress haproxy` (its own local cluster: Ray reads the setting when each
    process starts): Ray Serve's HAProxy takes the port and routes to the replica's own HTTP server;
    the answers are the in-process ones, one x-request-id, the one error shape; stopped, it leaves no
    HAProxy or Ray process behind."""
    import psutil

    port = free_port()
    cmd = LiveServer.command(sharded_bundle_path, port, log_level="warning") + ["--ray", "--ingress", "haproxy"]
    srv = LiveServer.spawn(cmd, tmp_path / "haproxy.log", port=port,
                           env={"HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1", "SOFTKNN_LIMITS__MAX_K": "512"})
    tree: list[psutil.Process] = []
    try:
        srv.wait_ready(600, interval=1.0)
        tree = psutil.Process(srv.proc.pid).children(recursive=True)
        listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert {psutil.Process(c.pid).name() for c in listening} == {"haproxy"}, listening
        r = srv.client.post("/v1/infer", json=REQUEST)
        assert r.status_code == 200, r.text
        assert _same(r.json()["results"], _answers(encoder, sharded_bundle_path))
        assert r.json()["bundle_version"] == read_manifest(sharded_bundle_path)["version_id"]
        assert r.headers.get_list("x-request-id") == [r.headers["x-request-id"]]
        bad = srv.client.post("/v1/infer", json={"inputs": ["x"], "k": 0})
        assert bad.status_code == 422 and set(bad.json()["error"]) == {"type", "message", "field"}
    finally:
        assert srv.close() == 0, srv.log_path.read_text(errors="replace")[-3000:]
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
