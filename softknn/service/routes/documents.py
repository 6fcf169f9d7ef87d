"""PUT/DELETE/GET /v1/documents/{doc_id}: KB writes (softknn.storage.writes; docs/design.md "KB writes").

A write answers once it is durable (its write-ahead log record fsynced) and the new version serves;
`bundle_version` names that version. The KB is the `kb` query parameter (empty: the default KB,
softknn.service.kbs). Writes need the admin token or a key with the write scope for that KB (none
configured: 403, like /v1/admin/*); reading a document needs read access like every /v1 read.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from softknn.service.auth import AdminDep, ReaderDep, WriterDep
from softknn.service.deps import KBQuery, KBsDep, RequestIdDep
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
            summary="Add or replace one KB document")
async def put_document(doc_id: str, body: DocumentRequest, kbs: KBsDep, who: WriterDep, request_id: RequestIdDep,
                       kb: KBQuery = None) -> dict:
    """Chunked, encoded and indexed by the builder's own code; its chunks replace the document's old
    ones (it keeps its place in the KB; a new id goes to the end). 409 for a bundle that does not
    take writes (sharded, generator memory)."""
    engine, result = await kbs.pick(kb, who, "write").writes.write("put", doc_id, body.model_dump())
    return _write(engine, request_id, result)


@router.delete("/documents/{doc_id:path}", response_model=WriteResponse, responses=ERRORS,
               summary="Delete one KB document")
async def delete_document(doc_id: str, kbs: KBsDep, who: WriterDep, request_id: RequestIdDep,
                          kb: KBQuery = None) -> dict:
    """Every chunk of the document leaves the KB, and its terms the BM25 statistics. 404 if absent."""
    engine, result = await kbs.pick(kb, who, "write").writes.write("delete", doc_id)
    return _write(engine, request_id, result)


@router.get("/documents/{doc_id:path}", response_model=DocumentResponse, responses=ERRORS,
            summary="One KB document and its chunks")
async def get_document(doc_id: str, kbs: KBsDep, who: ReaderDep, request_id: RequestIdDep,
                       kb: KBQuery = None) -> dict:
    engine, doc = kbs.pick(kb, who).writes.document(doc_id)
    return {**served(request_id, engine), "document": {k: v for k, v in doc.items() if k != "bundle_version"}}


@router.post("/admin/compact", response_model=CompactResponse, responses=ERRORS,
             summary="Fold logged KB writes into a new base bundle")
async def compact(kbs: KBsDep, who: AdminDep, request_id: RequestIdDep, kb: KBQuery = None) -> dict:
    engine, result = await kbs.pick(kb, who).writes.compact()
    return {**served(request_id, engine), "writes_folded": result["writes_folded"],
            "recalibrated": result["recalibrated"], "index": engine.bundle.summary()}
