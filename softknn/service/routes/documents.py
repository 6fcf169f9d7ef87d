"""PUT/DELETE/GET /v1/documents/{doc_id}: KB writes (softknn.index_builder.writes; docs/design.md "KB writes").

A write answers once it is durable (its write-ahead log record fsynced) and the new version serves;
`bundle_version` names that version. Writes need the admin token (no token configured: 403, like
/v1/admin/*); reading a document needs the API key like every /v1 read.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from softknn.service.auth import require_admin, require_api_key
from softknn.service.deps import RequestIdDep, RuntimeDep
from softknn.service.schemas import (
    CompactResponse,
    DocumentRequest,
    DocumentResponse,
    ErrorResponse,
    WriteResponse,
    served,
)

router = APIRouter(prefix="/v1", tags=["documents"])
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 403, 404, 409, 413, 422, 503)}


def _write(engine, request_id: str, result) -> dict:
    return {**served(request_id, engine), "op": result.op, "doc_id": result.doc_id, "seq": result.seq,
            "chunks": result.chunks, "created": result.created, "durable": True}


# document ids may contain '/', e.g. "handbook/01_crew_safety_drills.md"
@router.put("/documents/{doc_id:path}", response_model=WriteResponse, responses=ERRORS,
            dependencies=[Depends(require_admin)], summary="Add or replace one KB document")
async def put_document(doc_id: str, body: DocumentRequest, runtime: RuntimeDep, request_id: RequestIdDep) -> dict:
    """Chunked, encoded and indexed by the builder's own code; its chunks replace the document's old
    ones (it keeps its place in the KB; a new id goes to the end). 409 for a bundle that does not
    take writes (sharded, generator memory)."""
    engine, result = await runtime.write("put", doc_id, body.model_dump())
    return _write(engine, request_id, result)


@router.delete("/documents/{doc_id:path}", response_model=WriteResponse, responses=ERRORS,
               dependencies=[Depends(require_admin)], summary="Delete one KB document")
async def delete_document(doc_id: str, runtime: RuntimeDep, request_id: RequestIdDep) -> dict:
    """Every chunk of the document leaves the KB, and its terms the BM25 statistics. 404 if absent."""
    engine, result = await runtime.write("delete", doc_id)
    return _write(engine, request_id, result)


@router.get("/documents/{doc_id:path}", response_model=DocumentResponse, responses=ERRORS,
            dependencies=[Depends(require_api_key)], summary="One KB document and its chunks")
async def get_document(doc_id: str, runtime: RuntimeDep, request_id: RequestIdDep) -> dict:
    engine, doc = runtime.document(doc_id)
    return {**served(request_id, engine), "document": {k: v for k, v in doc.items() if k != "bundle_version"}}


@router.post("/admin/compact", response_model=CompactResponse, responses=ERRORS,
             dependencies=[Depends(require_admin)], summary="Fold logged KB writes into a new base bundle")
async def compact(runtime: RuntimeDep, request_id: RequestIdDep) -> dict:
    engine, result = await runtime.compact()
    return {**served(request_id, engine), "writes_folded": result["writes_folded"],
            "recalibrated": result["recalibrated"], "index": engine.bundle.summary()}
