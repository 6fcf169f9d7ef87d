"""`softknn serve --ray --address` on a two-node Ray cluster on one machine (`ray start --head` and
`ray start --address`): one shard actor lands on each node, and the exact answer is the one-index one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.testing import free_port
from softknn.engine import Engine, InferParams
from tests.shards.test_sharded import QUERIES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this interpreter


def _ray(*args, env=None, check=True):
    r = subprocess.run([*RAY, *args], capture_output=True, text=True, timeout=300, env=env)
    if check and r.returncode:
        raise RuntimeError(f"ray {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A head node and a worker node, each with 2 CPUs and one `shard` slot."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    temp = tmp_path_factory.mktemp("ray")
    _ray("start", "--head", f"--port={port}", "--num-cpus=2", '--resources={"shard": 1, "head": 1}',
         "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats", env=env)
    try:
        _ray("start", f"--address=127.0.0.1:{port}", "--num-cpus=2", '--resources={"shard": 1}', env=env)
        yield f"127.0.0.1:{port}", env
    finally:
        _ray("stop", "--force", env=env, check=False)


def test_serve_ray_on_two_nodes(two_nodes, sharded_bundle_path, sample_bundle, encoder, tmp_path):
    address, env = two_nodes
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**env, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1"}
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "--bundle", str(sharded_bundle_path), "--ray",
                                 "--address", address, "--port", str(port),
                                 "--shard-resources", json.dumps({"shard": 1})], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            end = time.monotonic() + 600
            while time.monotonic() < end:
                assert proc.poll() is None, log.read_text()[-4000:]
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(1)
            assert c.get("/readyz").status_code == 200, log.read_text()[-4000:]
            want = [r.to_dict() for r in Engine(encoder, sample_bundle).infer(QUERIES, InferParams(exact=True))]
            got = c.post("/v1/infer", json={"inputs": QUERIES, "exact": True}).json()["results"]
            for a, b in zip(want, got, strict=True):
                assert np.abs(np.asarray(a["embedding"]) - np.asarray(b["embedding"])).max() <= 1e-6
                assert [e["chunk_id"] for e in a["evidence"]] == [e["chunk_id"] for e in b["evidence"]]
        # one shard actor on each node: each node has one `shard` slot, each actor takes one, none is left
        out = subprocess.run([sys.executable, "-c", (
            "import json, ray; ray.init(address=%r);"
            "print(json.dumps([sum(n['Alive'] for n in ray.nodes()), ray.cluster_resources().get('shard'),"
            " ray.available_resources().get('shard', 0)]))" % address)], capture_output=True, text=True, env=env,
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
