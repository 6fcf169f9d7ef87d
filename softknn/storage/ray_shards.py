"""The shards of a sharded bundle as Ray actors: `RayShards`, a ShardBackend (softknn.model.backends).

- `RayShards`: one actor per shard (`softknn.storage.shards.Shard`, the same class the in-process serving
  uses), created with `max_restarts=-1` so Ray restarts a shard whose process dies. Each actor is
  created for one shard version: at every (re)start it checks its own files' checksums (index,
  embeddings, memory: softknn.storage.layout.shard_own_files; the replica checks the metadata it opens)
  and the version in its manifest, and refuses to open other files (a bundle rebuilt in place: the actor stays
  dead rather than serve the new rows to a replica merging them with the old ones). Every answer
  carries the version the shard holds, and one that is not the replica's is refused
  (`ShardMismatch`, 503). A call to a dead or restarting shard, or one that does not answer within
  `timeout_s`, raises `ShardUnavailable` (503 with Retry-After): no answer is ever computed
  without a shard. `health` says which shard does not answer (/readyz).
- the named shard actors of a deployment (`actor_names`, their placement groups, `kill_named`,
  `shard_actor_names`): what `softknn serve --ray` (softknn.service.ray) creates, reloads and removes.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from softknn.common.errors import BundleError, ShardMismatch, ShardsNotPlaced, ShardUnavailable
from softknn.storage.shards import Shard

if TYPE_CHECKING:
    from ray.actor import ActorClass

log = logging.getLogger(__name__)
NAMESPACE = "softknn"
ACTOR_PREFIX = "softknn-shard-"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNPLACED = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")


def ray_reason(e: BaseException) -> str:
    """A Ray actor error in one line: its last line (the creation task's own error, or why Ray says
    the actor is gone), without colour codes."""
    lines = [x.strip() for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
    return (lines[-1] if lines else type(e).__name__)[:400]


def _actor_state(handle) -> str | None:
    """The GCS's state of an actor (PENDING_CREATION, ALIVE, RESTARTING, DEAD), None if unknown.
    Read from the GCS, not the state API: that needs the dashboard, which the service leaves off."""
    try:
        from ray._private.state import actors

        return actors(handle._actor_id.hex()).get("State")
    except Exception:  # an older or newer Ray without it: placement is then only timed
        return None


class RayShards:
    """`LocalShards`' interface (call / call_some / health / close) over Ray actors: one per shard, or
    `copies` per shard (replicated shards), spread apart over the nodes by a placement group per
    shard (strategy SPREAD: on distinct nodes where there are enough, packed where not). A request
    goes to one live copy of each shard, in turn; a copy that is gone or restarting is skipped
    (for DOWN_S, then tried again) and its request resent to another copy, so a lost node costs
    no answer while another copy of each of its shards lives."""

    DOWN_S = 5.0  # a copy that failed a call is tried again only after this, unless no other copy is left

    def __init__(self, specs: list[tuple], *, names: list[str] | None = None, versions: list[str | None] | None = None,
                 init_kwargs: dict | None = None, num_cpus: float = 1.0, resources: dict | None = None,
                 timeout_s: float = 30.0, load_timeout_s: float = 600.0, place_timeout_s: float | None = None,
                 copies: int = 1, actor_cls: type = Shard, local_reads: bool = True):
        """specs: per shard, the arguments of `actor_cls` (Shard: its directory, first row and version);
        names: detached named actors (the Coordinator's; they outlive this object) instead of owned ones,
        `copies` per shard, shard-major (actor_names); versions: per shard the version its answers must
        carry (None: not checked); local_reads: memory rows of a shard on this machine are read from its
        files by the caller (softknn.storage.shards.map_local), not sent by the actor."""
        import ray

        if copies < 1:
            raise ValueError(f"copies must be ≥ 1, got {copies}")
        self.timeout_s = timeout_s
        self.copies = copies
        self.local_reads = local_reads
        self.labels = [_label(spec, s) for s, spec in enumerate(specs)]
        self.versions = list(versions) if versions is not None else [None] * len(specs)
        self.needs = {"CPU": num_cpus, **(resources or {})}
        self._init_routing(len(specs))
        actor: ActorClass[Any] = ray.remote(actor_cls)
        opts: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": num_cpus}  # Ray's actor options
        opts.update({"resources": resources} if resources else {"scheduling_strategy": "SPREAD"})
        # Ray actor handles: Ray types a handle's method calls (h.ping.remote()) only for methods
        # decorated with ray.method, and ray is imported only where it is used
        self.handles: list[Any] = []  # shard-major: shard s's copy c is handles[s * copies + c]
        self.groups: list[Any] = []  # the placement groups (copies > 1), one per shard
        self.owned = names is None
        try:
            for s, spec in enumerate(specs):
                placed: list[dict[str, Any]] = [{}] * copies
                if copies > 1:
                    from ray.util.placement_group import placement_group
                    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                    group = placement_group([dict(self.needs) for _ in range(copies)], strategy="SPREAD",
                                            **({"name": group_name(names[s * copies]), "lifetime": "detached"}
                                               if names else {}))
                    self.groups.append(group)
                    placed = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(group, c)}
                              for c in range(copies)]
                for c in range(copies):
                    named = ({"name": names[s * copies + c], "namespace": NAMESPACE, "lifetime": "detached"}
                             if names else {})
                    self.handles.append(actor.options(**{**opts, **placed[c]}, **named).remote(
                        *spec, **(init_kwargs or {})))
            self._wait_loaded(load_timeout_s, place_timeout_s)
        except BaseException as e:  # a shard that cannot load or be placed: none of this set is used
            self.close(force=True)
            if isinstance(e, ShardUnavailable | BundleError):
                raise
            if isinstance(e, Exception):
                raise BundleError(f"shard actors failed to load: {ray_reason(e)}") from e
            raise

    def _init_routing(self, n_shards: int) -> None:
        self.n_shards = n_shards
        self._turn = [0] * n_shards  # the next copy each shard's request goes to
        self._down: dict[int, float] = {}  # handle index -> until when it is skipped
        self.degraded: list[str] = []  # copies that did not answer the last health check (others did)

    def _who(self, i: int) -> str:
        """Handle i's name in messages: its shard's label, and its copy where there are several."""
        s, c = divmod(i, self.copies)
        return self.labels[s] + (f" copy {c}" if self.copies > 1 else "")

    def _wait_loaded(self, load_timeout_s: float, place_timeout_s: float | None) -> None:
        """Until every actor answers ping; ShardsNotPlaced when one is still waiting for room after
        place_timeout_s, BundleError when one failed to open (its own error) or after load_timeout_s."""
        import ray

        start = time.monotonic()
        refs = {h.ping.remote(): i for i, h in enumerate(self.handles)}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=1.0)
            for r in ready:
                i = refs.pop(r)
                try:
                    got = ray.get(r)
                except Exception as e:
                    raise BundleError(f"{self._who(i)} failed to load: {ray_reason(e)}") from e
                self._check(i // self.copies, got)
            waited = time.monotonic() - start
            if refs and place_timeout_s is not None and waited > place_timeout_s:
                # pending creation also covers a worker process still starting: no room is
                # pending with fewer resources free than one actor needs
                free = _free()
                unplaced = [i for i in refs.values() if _actor_state(self.handles[i]) in _UNPLACED]
                if unplaced and free is not None and any(free.get(k, 0.0) < v for k, v in self.needs.items()):
                    raise ShardsNotPlaced(
                        f"{len(unplaced)} shard actor(s) ({', '.join(self._who(i) for i in sorted(unplaced))}) "
                        f"found no room in the cluster within {place_timeout_s:g} s (each needs "
                        f"{', '.join(f'{k} {v:g}' for k, v in self.needs.items())}; available now: {_available()}); "
                        "nothing of this bundle is served")
            if refs and waited > load_timeout_s:
                raise BundleError(f"shard actors did not load within {load_timeout_s:g} s: "
                                  f"{', '.join(self._who(i) for i in sorted(refs.values()))}")

    def _check(self, s: int, version: str) -> None:
        want = self.versions[s]
        if want is not None and version != want:
            raise ShardMismatch(f"{self.labels[s]} holds shard version {version}, this service serves {want} (the "
                                "bundle was rebuilt in place): answer refused; POST /v1/admin/reload to serve it")

    @classmethod
    def factory(cls, **opts):
        """A `load_bundle(shard_backend=...)` factory: specs → RayShards owned by the bundle (tests,
        one process); each actor verifies its own files and is pinned to its shard version."""
        def make(specs, version=""):
            return cls(specs, versions=[sp[2] for sp in specs], init_kwargs={"verify": True}, **opts)
        return make

    @classmethod
    def attach(cls, names: list[str], specs: list[tuple], *, timeout_s: float = 30.0,
               load_timeout_s: float = 600.0, local_reads: bool = True) -> RayShards:
        """The Coordinator's named shard actors of `specs`' bundle (shard-major, the same number of
        copies of each shard), not owned (never killed by close)."""
        import ray

        self = cls.__new__(cls)
        self.timeout_s, self.owned, self.needs, self.groups = timeout_s, False, {}, []
        self.local_reads = local_reads
        self.copies = max(1, len(names) // max(1, len(specs)))
        self.labels = [_label(spec, s) for s, spec in enumerate(specs)]
        self.versions = [sp[2] for sp in specs]
        self._init_routing(len(specs))
        try:
            self.handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
        except ValueError as e:
            raise BundleError(f"the deployment's shard actors are gone ({e}); POST /v1/admin/reload") from e
        self._wait_loaded(load_timeout_s, None)
        return self

    def call(self, method: str, args: list[tuple]) -> list:
        return self.call_some(method, list(range(self.n_shards)), args)

    def _pick(self, s: int, tried: set[int]) -> int | None:
        """The copy of shard s a call goes to: the next in turn not tried by this call and not lately
        down; one lately down when only such are left (it may be back); None when all were tried."""
        left = [s * self.copies + (self._turn[s] + c) % self.copies for c in range(self.copies)]
        left = [i for i in left if i not in tried]
        if not left:
            return None
        now = time.monotonic()
        up = [i for i in left if self._down.get(i, 0.0) <= now]
        i = (up or left)[0]
        self._turn[s] = (i % self.copies + 1) % self.copies
        return i

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        """`method` on one copy of each of `shards`, all at once; a copy that is gone or restarting is
        marked down and the call resent to another copy of its shard. ShardUnavailable when a shard
        has no copy left to try, or one does not answer within timeout_s."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        picks: list[int] = []
        for s in shards:
            i = self._pick(s, set())
            assert i is not None  # a shard has at least one copy
            picks.append(i)
        refs = [self.handles[i].run.remote(method, a) for i, a in zip(picks, args, strict=True)]
        tried: list[set[int]] = [set() for _ in shards]
        out: list[Any] = []
        deadline = time.monotonic() + self.timeout_s
        try:
            for j, s in enumerate(shards):
                while True:
                    try:
                        out.append(ray.get(refs[j], timeout=max(0.0, deadline - time.monotonic())))
                        break
                    except (RayActorError, ActorUnavailableError) as e:
                        i = picks[j]
                        self._down[i] = time.monotonic() + self.DOWN_S
                        tried[j].add(i)
                        nxt = self._pick(s, tried[j])
                        if nxt is None:
                            raise ShardUnavailable(f"a KB shard is unavailable ({ray_reason(e)}); retry shortly") from e
                        log.warning("%s failed a call (%s): resent to copy %d", self._who(i), ray_reason(e),
                                    nxt % self.copies)
                        picks[j], refs[j] = nxt, self.handles[nxt].run.remote(method, args[j])
        except (ShardUnavailable, GetTimeoutError) as e:
            for r in refs:
                try:
                    ray.cancel(r, force=False)
                except Exception:  # already finished, or its actor gone
                    pass
            if isinstance(e, ShardUnavailable):
                raise
            raise ShardUnavailable("a KB shard is unavailable (not answering); retry shortly") from e
        for s, (version, _) in zip(shards, out, strict=True):
            self._check(s, version)
        return [r for _, r in out]

    def health(self, timeout_s: float | None = None) -> list[str]:
        """One line per shard that has no copy answering (gone, restarting or not placed, or holding
        another version); [] when every shard has one. Copies that fail while another copy of their
        shard answers are listed in `degraded` instead. A copy that does not answer a ping within
        `timeout_s` (default: the call timeout, at most 5 s) while Ray has it alive is busy, not down:
        readiness does not flap under load."""
        import ray

        t = timeout_s if timeout_s is not None else min(self.timeout_s, 5.0)
        refs = [h.ping.remote() for h in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=t)
        done = set(ready)
        fails: dict[int, str] = {}
        for i, r in enumerate(refs):
            if r not in done:
                state = _actor_state(self.handles[i])
                if state != "ALIVE":
                    fails[i] = f"{self._who(i)} does not answer within {t:g} s (Ray: {state or 'unknown'})"
                continue
            try:
                self._check(i // self.copies, ray.get(r))
            except ShardMismatch as e:
                fails[i] = e.message
            except Exception as e:
                gone = _actor_state(self.handles[i]) == "DEAD"
                why = ray_reason(e).rstrip(".")
                fails[i] = (f"{self._who(i)} is {'gone for good' if gone else 'unavailable'}: {why}"
                            + ("; POST /v1/admin/reload to start its shards again" if gone and "reload" not in why
                               else ""))
        problems: list[str] = []
        degraded: list[str] = []
        for s in range(self.n_shards):
            mine = [fails[i] for i in range(s * self.copies, (s + 1) * self.copies) if i in fails]
            (problems if len(mine) == self.copies else degraded).extend(mine)
        self.degraded = degraded
        return problems

    def close(self, force: bool = False) -> None:
        import ray

        if self.owned or force:
            for h in self.handles:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:  # already gone
                    pass
            for g in self.groups:
                _remove_group(g)
        self.handles, self.groups = [], []


def actor_names(prefix: str, n_shards: int, copies: int = 1) -> list[str]:
    """The named actors of a shard set, shard-major: `prefix-S` (one copy) or `prefix-S-cC`."""
    return [f"{prefix}-{s}" + (f"-c{c}" if copies > 1 else "") for s in range(n_shards) for c in range(copies)]


def group_name(first_copy: str) -> str:
    """The placement group of a shard's copies, named after its first copy's actor."""
    return f"{first_copy}-pg"


def _remove_group(group) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # already removed
        pass


def remove_named_groups(names: list[str] | None = None) -> int:
    """Remove the placement groups of named shard sets: those of `names`' actors (group_name), or
    every one `serve_ray` created (None); returns how many."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table

    want = None if names is None else {group_name(n) for n in names}
    n = 0
    for gid, info in placement_group_table().items():
        name = info.get("name") or ""
        if info.get("state") != "REMOVED" and name.startswith(ACTOR_PREFIX) and (want is None or name in want):
            _remove_group(PlacementGroup(PlacementGroupID.from_hex(gid)))
            n += 1
    return n


def _label(spec: tuple, s: int) -> str:
    d = spec[0] if spec and isinstance(spec[0], str | Path) else None
    return f"shard {s} ({Path(d).name})" if d is not None else f"shard {s}"


def _free() -> dict[str, float] | None:
    """The cluster's free logical resources (CPU and custom ones), None if Ray cannot say."""
    import ray

    try:
        free = ray.available_resources()
    except Exception:
        return None
    return {k: v for k, v in free.items() if not k.startswith(("node:", "memory", "object_store_memory"))}


def _available() -> str:
    free = _free()
    if free is None:
        return "unknown"
    return ", ".join(f"{k} {v:g}" for k, v in sorted(free.items())) or "nothing"


def kill_named(name: str) -> bool:
    import ray

    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        return True
    except ValueError:  # no such actor (gone already)
        return False


def shard_actor_names() -> list[str]:
    """The live named shard actors of `serve_ray` in this cluster (sorted)."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX))


