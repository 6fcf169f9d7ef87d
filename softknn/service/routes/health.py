"""Liveness and readiness (no key). /readyz is 503 until the model and a bundle are loaded and warm,
and while a shard of a sharded bundle does not answer."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from softknn.service.deps import KBsDep, RuntimeDep
from softknn.service.errors import NotReady, StartupFailed
from softknn.service.schemas import ErrorResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers (503 only if startup failed)",
            responses={503: {"model": ErrorResponse}})
async def healthz(kbs: KBsDep) -> dict:
    for rt in kbs:  # no KB names here: these routes take no key
        if rt.status == "failed":
            raise StartupFailed(f"startup failed: {rt.error}")
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: model and bundle loaded and warm",
            responses={503: {"model": ErrorResponse}})
async def readyz(kbs: KBsDep, runtime: RuntimeDep) -> dict:
    """Ready when every KB is; `bundle_version` is the KB named `default`'s, else the first KB's."""
    # a sharded KB is ready when every shard has a copy that answers; copies that do not while
    # another does (replicated shards) are listed under `degraded`
    degraded: list[str] = []
    for rt in kbs:  # no KB names here: these routes take no key
        engine = rt.current()  # NotReady → 503 until then
        if not rt.ready:
            raise NotReady(rt.error or rt.status)
        health = getattr(engine.bundle, "health", None)  # a sharded bundle: do its shards answer?
        if health is not None:
            problems = await asyncio.to_thread(health)
            if problems:
                raise NotReady("not every KB shard answers: " + "; ".join(problems))
            degraded += getattr(getattr(engine.bundle, "backend", None), "degraded", None) or []
    engine = runtime.current()
    return {"status": "ready", "bundle_version": engine.bundle.version, "model": engine.encoder.info.name,
            **({"degraded": degraded} if degraded else {})}
