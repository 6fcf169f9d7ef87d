"""GET /v1/kbs (the KBs a caller may name), GET /v1/index (the bundle's manifest summary) and
GET /v1/entries/{chunk_id} (one KB chunk)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from softknn.common.errors import InvalidInput
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBQuery, KBsDep, RequestIdDep, SettingsDep
from softknn.service.errors import NotFound
from softknn.service.schemas import (
    EntryResponse,
    ErrorResponse,
    IndexResponse,
    KbsResponse,
    entry_payload,
    runtime_payload,
    served,
)

router = APIRouter(prefix="/v1", tags=["index"])
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (401, 404, 422, 503)}


@router.get("/kbs", response_model=KbsResponse, responses={401: {"model": ErrorResponse}},
            summary="The KBs this credential may name, with their state and the default")
async def list_kbs(kbs: KBsDep, who: ReaderDep, request_id: RequestIdDep) -> dict:
    items = []
    for name in kbs.visible(who):
        rt = kbs.runtimes[name]
        engine = rt.engine if rt.status == "ready" else None
        items.append({"name": name, "status": rt.status, "error": rt.error,
                      "bundle_version": engine.bundle.version if engine is not None else None,
                      "chunks": len(engine.bundle.chunks) if engine is not None else None})
    try:
        default: str | None = kbs.default_for(who)
    except InvalidInput:
        default = None
    return {"request_id": request_id, "kbs": items, "default": default, "write": who.write}


@router.get("/index", response_model=IndexResponse, responses=ERRORS, summary="The served bundle's summary")
async def index(kbs: KBsDep, who: ReaderDep, settings: SettingsDep, request_id: RequestIdDep,
                kb: KBQuery = None) -> dict:
    engine = kbs.pick(kb, who).current()
    return {**served(request_id, engine), "index": engine.bundle.summary(), "runtime": runtime_payload(engine.encoder),
            "defaults": {"infer": settings.defaults.model_dump(), "generate": settings.generate.model_dump()}}


# chunk ids may contain '/', e.g. "handbook/01_crew_safety_drills.md#0" (a '#' must be sent as %23)
@router.get("/entries/{chunk_id:path}", response_model=EntryResponse, responses=ERRORS,
            summary="One KB chunk with its provenance")
async def entry(chunk_id: str, kbs: KBsDep, who: ReaderDep, request_id: RequestIdDep, kb: KBQuery = None) -> dict:
    engine = kbs.pick(kb, who).current()
    row = engine.bundle.row_of(chunk_id)
    if row is None:
        raise NotFound(f"no chunk {chunk_id!r} in bundle {engine.bundle.version}", field="chunk_id")
    return {**served(request_id, engine), "entry": entry_payload(engine.bundle, row)}
