"""GET /v1/index, /v1/kbs, /v1/entry and POST /v1/admin/reload: the bundle's summary, the KBs, one
entry, and a reload."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from softknn.service.schemas.common import KB_DOC, STRICT, ChunkRef, Out, Served


class ReloadRequest(BaseModel):
    model_config = STRICT

    bundle: str = Field(min_length=1, max_length=4096, description="bundle directory, as the server sees "
                        "it, or a URI in object storage (s3://bucket/kb), fetched to the server's cache")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)


class BundleSummary(Out):
    version_id: str
    path: str
    created_at: str | None
    model: dict[str, Any]
    memory_layer: int
    index: dict[str, Any]
    kv_dtype: str
    memory: dict[str, Any] = Field(description="the memory representation (kv, hidden, hidden-fp16, hidden-int8, "
                                               "recompute): kind, files, bytes, bytes_per_chunk")
    counts: dict[str, int]
    labels: list[str]
    calibration: dict[str, Any]
    lexical: dict[str, Any] = Field(description="the BM25 index: available, default_retrieval, settings, bytes")
    generator: dict[str, Any] | None = Field(None, description="the generator memory (null: none): model, layers, "
                                             "representation, bytes_per_token, and `calibration`, the k and β its "
                                             "build chose from the KB's own pseudo-questions")
    bytes: int


class KBInfo(Out):
    name: str = Field(description="the KB's name: send it as `kb` (a body field on POST routes, a query parameter elsewhere)")
    status: str = Field(description="starting | ready | no_bundle | failed")
    bundle_version: str | None = Field(description="version_id of the bundle it serves; null until it is ready")
    chunks: int | None = Field(description="chunks in that bundle; null until it is ready")
    error: str | None = Field(description="why it is not ready (no_bundle, failed); else null")


class KbsResponse(Out):
    request_id: str
    kbs: list[KBInfo] = Field(description="the KBs this caller's credential may see, in the order served")
    default: str | None = Field(description="the KB a request that names none gets; null when the caller sees "
                                "several and none is named `default` (then every request must name one)")
    write: bool = Field(description="whether this credential may write (PUT/DELETE /v1/documents) to these KBs")


class ModelRuntime(Out):
    name: str = Field(description="what runs the plain forward: torch | onnx")
    precision: str = Field(description="its numerics: fp32 | int8 (SOFTKNN_MODEL__PRECISION)")
    verified_max_abs_diff: float | None = Field(description="onnx: max |onnx − torch| over the verification "
                                                "inputs, checked at start; null for torch")
    requested: str = Field(description="what SOFTKNN_MODEL__RUNTIME asked for: auto | torch | onnx")
    fallback: str | None = Field(description="auto running torch: why onnx did not open here (not the CPU, "
                                 "onnxruntime missing, an export that failed its checks); else null")


class IndexResponse(Served):
    index: BundleSummary
    runtime: ModelRuntime = Field(description="the serving model runtime")
    defaults: dict[str, dict[str, Any]] | None = Field(None, description="what this server gives a request "
                                                       "parameter left unset, by route family (infer: /v1/infer, "
                                                       "/v1/embeddings, /v1/rerank; generate: /v1/generate, chat "
                                                       "completions): its settings SOFTKNN_DEFAULTS__*, "
                                                       "SOFTKNN_GENERATE__*; null: the bundle's own")


def runtime_payload(encoder) -> dict:
    onnx = getattr(encoder, "onnx", None)
    info = encoder.info
    return {"name": info.runtime, "precision": info.precision,
            "verified_max_abs_diff": onnx.verification["max_abs_diff"] if onnx is not None else None,
            "requested": getattr(info, "requested", info.runtime), "fallback": getattr(info, "fallback", None)}


class Entry(ChunkRef):
    row: int = Field(description="row of the chunk in the bundle")
    token_spans: list[tuple[int, int]] = Field(description="char span in the document of each memory token")


class EntryResponse(Served):
    entry: Entry


class ReloadResponse(Served):
    previous_version: str | None
    index: BundleSummary


def entry_payload(bundle, row: int) -> dict:
    c = bundle.chunks[row]
    st, n = int(bundle.kv.start[row]), int(bundle.kv.count[row])
    return {"row": row, "chunk_id": c["chunk_id"], "doc_id": c["doc_id"], "text": c["text"], "start": c["start"],
            "end": c["end"], "label": c.get("label"), "metadata": c.get("metadata") or {},
            "token_spans": [tuple(s) for s in bundle.token_spans[st : st + n].tolist()]}
