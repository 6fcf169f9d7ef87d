"""The shards of a sharded bundle as Ray actors, and the service as a Ray Serve deployment.

    softknn serve --bundle DIR --ray [--address ADDR] [--replicas R]

- `RayShards`: one actor per shard (`softknn.shards.Shard`, the same class the in-process serving
  uses), created with `max_restarts=-1` so Ray restarts a shard whose process dies (it reloads its
  files). A call to a dead or restarting shard, or one that does not answer within `timeout_s`,
  raises `ShardUnavailable` (503 with Retry-After): no answer is ever computed without a shard.
  Actors are spread over the cluster's nodes (`SPREAD`, or `resources` per shard).
- `serve_ray`: the service's own FastAPI app (`softknn.service.app.create_app`, same routes, OpenAPI, errors,
  metrics, admin reload) built on each replica by `serve.ingress(builder)`; R replicas hold the
  model, the shard actors are shared by the replicas through their names (one set per bundle
  version), so a reload loads a whole new set of shards (or fails and keeps the old one).
"""

from __future__ import annotations

import logging
import math
import os

from softknn.errors import BundleError
from softknn.shards import Shard, ShardUnavailable

log = logging.getLogger(__name__)
NAMESPACE = "softknn"
ACTOR_PREFIX = "softknn-shard-"


class RayShards:
    """`LocalShards`' interface (call / call_some / close) over one Ray actor per shard."""

    def __init__(self, specs: list[tuple[str, int]], *, version: str = "", num_cpus: float = 1.0,
                 resources: dict | None = None, timeout_s: float = 30.0, load_timeout_s: float = 600.0,
                 shared: bool = False, actor_cls: type = Shard):
        """specs: per shard, the arguments of `actor_cls` (Shard: its directory and first row)."""
        import ray

        self.timeout_s = timeout_s
        actor = ray.remote(actor_cls)
        opts = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": num_cpus}
        opts.update({"resources": resources} if resources else {"scheduling_strategy": "SPREAD"})
        self.handles = []
        self.owned = not shared
        for s, spec in enumerate(specs):
            named = {"name": f"{ACTOR_PREFIX}{version}-{s}", "namespace": NAMESPACE, "get_if_exists": True,
                     "lifetime": "detached"} if shared else {}
            self.handles.append(actor.options(**opts, **named).remote(*spec))
        try:
            ray.get([h.ping.remote() for h in self.handles], timeout=load_timeout_s)
        except Exception as e:  # a shard that cannot load: none of this set is used
            self.close(force=True)
            raise BundleError(f"shard actors failed to load: {type(e).__name__}: {e}") from e

    @classmethod
    def factory(cls, **opts):
        """A `load_bundle(shard_backend=...)` factory: specs → RayShards (named by the bundle version)."""
        def make(specs, version=""):
            return cls(specs, version=version, **opts)
        return make

    def call(self, method: str, args: list[tuple]) -> list:
        return self.call_some(method, list(range(len(self.handles))), args)

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        refs = [getattr(self.handles[s], method).remote(*a) for s, a in zip(shards, args, strict=True)]
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except (RayActorError, ActorUnavailableError, GetTimeoutError) as e:
            for r in refs:
                try:
                    ray.cancel(r, force=False)
                except Exception:  # already finished, or its actor gone
                    pass
            raise ShardUnavailable(f"a KB shard is unavailable (restarting or not answering: {type(e).__name__}); "
                                   "retry shortly") from e

    def close(self, force: bool = False) -> None:
        import ray

        if self.owned or force:
            for h in self.handles:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:  # already gone
                    pass
        self.handles = []


def kill_named_shards() -> int:
    """Kill every shard actor `serve_ray` created (detached, named); returns how many."""
    import ray

    n = 0
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX):
            try:
                ray.kill(ray.get_actor(a["name"], namespace=NAMESPACE), no_restart=True)
                n += 1
            except ValueError:
                pass
    return n


def _interrupt(signum, frame):  # SIGTERM: shut down like Ctrl-C (Serve app, shard actors, local cluster)
    raise KeyboardInterrupt


def serve_ray(settings, *, address: str | None = None, replicas: int = 1, num_cpus: float | None = None,
              replica_cpus: float = 1.0, shard_cpus: float = 1.0, shard_resources: dict | None = None,
              blocking: bool = True) -> None:
    """Start (or join, `address`) a Ray cluster and run the service as a Serve application on
    settings.host:settings.port: `replicas` model replicas, one actor per shard of the bundle
    (spread over the nodes, or placed by `shard_resources`, e.g. {"shard": 1})."""
    import signal

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
        # Its logical CPUs must hold every actor this starts, or a shard actor waits forever for a
        # CPU (2 shards + 1 replica on a 2-core machine): at least the machine's cores, at least that.
        if num_cpus is None:
            num_cpus = max(os.cpu_count() or 1, math.ceil(replicas * replica_cpus + _shard_count(settings) * shard_cpus))
        ray.init(address="local", num_cpus=num_cpus, namespace=NAMESPACE, include_dashboard=False)
    opts = {"num_cpus": shard_cpus, "shared": True, "resources": shard_resources}

    def build_app():  # runs on each replica: the same app as `softknn serve`, its shards as actors
        return create_app(settings, shard_backend=RayShards.factory(**opts))

    deployment = serve.deployment(serve.ingress(build_app)(), name="softknn", num_replicas=replicas,
                                  ray_actor_options={"num_cpus": replica_cpus})
    serve.start(http_options={"host": settings.host, "port": settings.port})
    if blocking:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.run(deployment.bind(), name="softknn", route_prefix="/", blocking=blocking)
    finally:
        if blocking:
            shutdown_ray()


def _shard_count(settings) -> int:
    """How many shard actors serving settings.bundle starts (0 for an unsharded bundle)."""
    from softknn.bundle import read_manifest

    try:
        return len(read_manifest(settings.bundle).get("shards") or [])
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
