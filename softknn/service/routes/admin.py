"""POST /v1/admin/reload: verify and load another bundle off the hot path, then swap atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter

from softknn.service.auth import AdminDep
from softknn.service.deps import KBsDep, RequestIdDep
from softknn.service.schemas import ErrorResponse, ReloadRequest, ReloadResponse, served
from softknn.storage.remote import is_remote

router = APIRouter(prefix="/v1/admin", tags=["admin"])
# 400 malformed JSON and 413 body over the limit reach this route like any other with a body (found by
# tests/reliability/test_fuzz.py: they were answered but not documented)
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 403, 404, 409, 413, 422, 503)}


@router.post("/reload", response_model=ReloadResponse, responses=ERRORS, summary="Swap to another bundle")
async def reload(body: ReloadRequest, kbs: KBsDep, who: AdminDep, request_id: RequestIdDep) -> dict:
    """The KB `kb` names (or the default KB) swaps; the others keep serving as they were. A bundle
    that fails verification or was built for other model weights is refused (422, bundle_error) and
    the old bundle keeps serving."""
    previous, engine = await kbs.pick(body.kb, who).reload(body.bundle if is_remote(body.bundle) else Path(body.bundle))
    return {**served(request_id, engine), "previous_version": previous, "index": engine.bundle.summary()}
