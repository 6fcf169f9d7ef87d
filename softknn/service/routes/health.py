"""Liveness and readiness (no key). /readyz is 503 until the model and a bundle are loaded and warm,
and while a shard of a sharded bundle does not answer."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from softknn.service.deps import RuntimeDep
from softknn.service.errors import NotReady, StartupFailed
from softknn.service.schemas import ErrorResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers (503 only if startup failed)",
            responses={503: {"model": ErrorResponse}})
async def healthz(runtime: RuntimeDep) -> dict:
    if runtime.status == "failed":
        raise StartupFailed(f"startup failed: {runtime.error}")
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: model and bundle loaded and warm",
            responses={503: {"model": ErrorResponse}})
async def readyz(runtime: RuntimeDep) -> dict:
    engine = runtime.current()  # NotReady → 503 until then
    if not runtime.ready:
        raise NotReady(runtime.error or runtime.status)
    health = getattr(engine.bundle, "health", None)  # a sharded bundle: do its shards answer?
    if health is not None:
        problems = await asyncio.to_thread(health)
        if problems:
            raise NotReady("not every KB shard answers: " + "; ".join(problems))
    return {"status": "ready", "bundle_version": engine.bundle.version, "model": engine.encoder.info.name}
