"""POST /v1/admin/reload: verify and load another bundle off the hot path, then swap atomically."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

from service.deps import RequestIdDep, RuntimeDep
from service.schemas import ErrorResponse, ReloadRequest, ReloadResponse, served

router = APIRouter(prefix="/v1/admin", tags=["admin"])
ERRORS = {s: {"model": ErrorResponse} for s in (401, 403, 409, 422, 503)}


@router.post("/reload", response_model=ReloadResponse, responses=ERRORS, summary="Swap to another bundle")
async def reload(body: ReloadRequest, runtime: RuntimeDep, request_id: RequestIdDep) -> dict:
    """A bundle that fails verification or was built for other model weights is refused (422,
    bundle_error) and the old bundle keeps serving."""
    previous, engine = await runtime.reload(Path(body.bundle))
    return {**served(request_id, engine), "previous_version": previous, "index": engine.bundle.summary()}
