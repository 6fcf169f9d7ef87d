"""The deployment's record of what it serves, and each replica's link to it.

- `Coordinator`: one detached actor per Serve application, the deployment's record of what it
  serves: the bundle, its version and its one set of shard actors (named by version and
  generation). A reload goes through it: it opens the new shard set (placed within
  `place_timeout_s`, or the reload fails with `ShardsNotPlaced` and the old set keeps serving),
  every replica opens the new bundle on it (prepare), and only when every replica has it does
  every replica swap (commit); then the old shard set is killed. A replica that fails to prepare
  fails the reload for all of them.
- `ReplicaLink`: a replica's side of it (softknn.service.runtime.core.Runtime's `cluster`): loads what the
  coordinator says is served, follows its reloads, and sends POST /v1/admin/reload to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

from softknn.common.errors import BundleError, ShardMismatch, ShardsNotPlaced, ShardUnavailable
from softknn.storage.manifest import Manifest
from softknn.storage.ray_shards import (
    ACTOR_PREFIX,
    NAMESPACE,
    RayShards,
    actor_names,
    kill_named,
    ray_reason,
    remove_named_groups,
)
from softknn.storage.remote import is_remote, read_location_manifest
from softknn.storage.shards import shard_specs

log = logging.getLogger(__name__)
COORDINATOR = "softknn-coordinator"


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
        return engine, await runtime.generation.open(engine)

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
            runtime.install(engine, generation)
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
                log.warning("coordinator unreachable: %s", ray_reason(e))
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
                runtime.install(engine, generation)
                self.served, self.prepared = gen, None
        except Exception as e:  # noqa: BLE001 - reported to the coordinator, which fails the reload
            error = {"kind": getattr(e, "kind", "bundle_error"), "message": getattr(e, "message", None) or
                     f"{type(e).__name__}: {e}"}
            log.error("%s of bundle generation %d failed: %s", op, gen, error["message"])
        try:
            await self.coord.report.remote(self.id, gen, op, error)
        except Exception as e:  # noqa: BLE001
            log.warning("coordinator unreachable: %s", ray_reason(e))

    async def reload(self, runtime, path: Path | str) -> tuple[str | None, object]:
        """POST /v1/admin/reload on this replica: the coordinator swaps every replica or none."""
        from ray.exceptions import RayActorError

        from softknn.service.errors import Conflict, DeadlineExceeded, NotReady

        try:
            res = await self.coord.reload.remote(str(path))
        except RayActorError as e:
            raise NotReady(f"the deployment's coordinator is gone ({ray_reason(e)}): restart `softknn serve --ray`") from e
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
