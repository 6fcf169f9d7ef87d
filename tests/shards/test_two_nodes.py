"""`softknn serve --ray --address` on a two-node Ray cluster on one machine (`ray start --head` and
`ray start --address`, tests/ray_nodes.py): one shard actor lands on each node, and the exact answer is
the one-index one. The cluster is the test's own: token auth with its own token, stopped by process group."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from softknn.infer.engine import Engine, InferParams
from tests.harness import free_port, wait_ready
from tests.ray_nodes import ray_env, start_node, stop_node, wait_for_cpus
from tests.shards.test_sharded import QUERIES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a worker node, each with 2 CPUs and one `shard` slot: this test's own
    (tests/ray_nodes.py), stopped by their process groups."""
    port = free_port()
    env = ray_env()
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    address = f"127.0.0.1:{port}"
    nodes = [start_node("--head", f"--port={port}", "--num-cpus=2", '--resources={"shard": 1, "head": 1}',
                        "--include-dashboard=false", "--node-ip-address=127.0.0.1", temp_dir=temp, env=env)]
    try:
        wait_for_cpus(address, 2, nodes, env)
        nodes.append(start_node(f"--address={address}", "--num-cpus=2", '--resources={"shard": 1}',
                                "--node-ip-address=127.0.0.1", temp_dir=temp, env=env))
        wait_for_cpus(address, 4, nodes, env)
        yield address, env
    finally:
        for proc in reversed(nodes):
            stop_node(proc)
        shutil.rmtree(temp, ignore_errors=True)


def test_serve_ray_on_two_nodes(two_nodes, sharded_bundle_path, sample_bundle, encoder, tmp_path):
    address, env = two_nodes
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**env, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1"}
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "softknn.service.cli", "--bundle", str(sharded_bundle_path), "--ray",
                                 "--address", address, "--port", str(port),
                                 "--shard-resources", json.dumps({"shard": 1})], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            wait_ready(c, 600, proc=proc, log_path=log, interval=1, probe_timeout=10)
            want = [r.to_dict() for r in Engine(encoder, sample_bundle).infer(QUERIES, InferParams(exact=True))]
            got = c.post("/v1/infer", json={"inputs": QUERIES, "exact": True}).json()["results"]
            for a, b in zip(want, got, strict=True):
                assert np.abs(np.asarray(a["embedding"]) - np.asarray(b["embedding"])).max() <= 1e-6
                assert [e["chunk_id"] for e in a["evidence"]] == [e["chunk_id"] for e in b["evidence"]]
        # one shard actor on each node: each node has one `shard` slot, each actor takes one, none is left
        out = subprocess.run([sys.executable, "-c", (
            f"import json, ray; ray.init(address={address!r});"
            "print(json.dumps([sum(n['Alive'] for n in ray.nodes()), ray.cluster_resources().get('shard'),"
            " ray.available_resources().get('shard', 0)]))")], capture_output=True, text=True, env=env,
            timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [2, 2.0, 0], out.stdout
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
