"""Replicated shards (`softknn serve --ray --shard-replicas R`): R actors per shard, a shard's copies on
distinct nodes, every request answered by a live copy. A copy killed for good, and then a whole node
removed under load, cost no answer and no 503 while another copy of each shard lives; readiness
stays ready and names the lost copies; a shard with no copy left is a 503 and not ready.

The module's own two-node Ray cluster in this process (ray.cluster_utils.Cluster: a head and a worker
node of 2 logical CPUs each)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from softknn.common.errors import ShardUnavailable
from softknn.infer.engine import Engine, InferParams
from softknn.storage.bundle import load_bundle
from tests.shards.test_sharded import QUERIES, assert_same

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # two Ray nodes started and one removed: ~90 s


@pytest.fixture(scope="module")
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="softknn", log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster, worker
    ray.shutdown()
    cluster.shutdown()


def _node_of(handle) -> str:
    from ray._private.state import actors

    return actors(handle._actor_id.hex())["Address"]["NodeID"]


def _replicated(path, encoder):
    from softknn.storage.ray_shards import RayShards

    return load_bundle(path, expected_fingerprint=encoder.info.fingerprint,
                       shard_backend=RayShards.factory(num_cpus=0.5, copies=2, timeout_s=60))


def test_copies_on_distinct_nodes_answer_as_one_index(two_node_cluster, sharded_bundle_path, sample_bundle, encoder):
    b = _replicated(sharded_bundle_path, encoder)
    try:
        backend = b.backend
        assert backend.copies == 2 and len(backend.handles) == 4
        nodes = [_node_of(h) for h in backend.handles]
        assert nodes[0] != nodes[1] and nodes[2] != nodes[3], nodes  # each shard's copies apart
        want = Engine(encoder, sample_bundle)
        got = Engine(encoder, b)
        for retrieval in ("hybrid", "dense"):
            for exact in (False, True):
                p = InferParams(retrieval=retrieval, exact=exact)
                for _ in range(2):  # every copy in turn
                    assert_same(want.infer(QUERIES, p), got.infer(QUERIES, p))
        assert backend.health() == [] and backend.degraded == []
    finally:
        b.close()
    from softknn.storage.ray_shards import shard_actor_names

    assert ray.util.placement_group_table() and all(
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
    assert shard_actor_names() == []


def test_copies_killed_for_good(two_node_cluster, sharded_bundle_path, sample_bundle, encoder):
    """One copy of shard 1 killed for good: every answer is still the one-index one, health is [] and
    `degraded` names that copy; both killed: a 503 (ShardUnavailable) and health names shard 1."""
    b = _replicated(sharded_bundle_path, encoder)
    try:
        backend = b.backend
        p = InferParams(exact=True, k=8)
        want = Engine(encoder, sample_bundle).infer(QUERIES, p)
        engine = Engine(encoder, b)
        ray.kill(backend.handles[2], no_restart=True)  # shard 1, copy 0
        for _ in range(4):
            assert_same(want, engine.infer(QUERIES, p))
        assert backend.health() == []
        assert len(backend.degraded) == 1 and backend.degraded[0].startswith("shard 1 (shard-0001) copy 0 is gone for good")
        ray.kill(backend.handles[3], no_restart=True)
        with pytest.raises(ShardUnavailable):
            engine.infer(QUERIES, p)
        problems = backend.health()
        assert len(problems) == 2 and all(x.startswith("shard 1 (shard-0001) copy ") for x in problems), problems
        assert backend.degraded == []
    finally:
        b.close()


def test_a_lost_node_costs_no_answer(two_node_cluster, sharded_bundle_path, sample_bundle, encoder):
    """The worker node removed while 3 clients send requests: every request gets the one-index answer
    (no 503, no error): each shard's other copy is on the head node. (Last: the cluster is one node after.)"""
    cluster, worker = two_node_cluster
    b = _replicated(sharded_bundle_path, encoder)
    try:
        backend = b.backend
        head = ray.get_runtime_context().get_node_id()
        on_head = [i for i, h in enumerate(backend.handles) if _node_of(h) == head]
        assert sorted(i // 2 for i in on_head) == [0, 1], on_head  # one copy of each shard per node
        p = InferParams(exact=True, k=8)
        want = Engine(encoder, sample_bundle).infer(QUERIES[:2], p)
        engine = Engine(encoder, b)
        results: list[object] = []
        stop = threading.Event()
        lock = threading.Lock()

        def client():
            while not stop.is_set():
                try:
                    got: object = engine.infer(QUERIES[:2], p)
                except Exception as e:  # noqa: BLE001 - counted: the test asserts there are none
                    got = e
                with lock:
                    results.append(got)

        with ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(client) for _ in range(3)]
            while len(results) < 3:
                time.sleep(0.05)
            cluster.remove_node(worker)
            n = len(results)
            while len(results) < n + 30:
                time.sleep(0.05)
            stop.set()
            for f in futs:
                f.result()
        errors = [r for r in results if isinstance(r, Exception)]
        print(f"node lost: {len(results)} answers, {len(errors)} errors: {errors[:3]}")
        assert errors == []
        assert {i for i in backend._down} - set(on_head), backend._down  # the worker's copies failed over
        for r in results:
            assert_same(want, r)
        assert backend.health() == []
    finally:
        b.close()
