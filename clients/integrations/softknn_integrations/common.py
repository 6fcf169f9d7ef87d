"""What both frameworks' retrievers share: the /v1/infer call and the evidence → metadata mapping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from softknn_client import AuthenticatedClient, Client
from softknn_client.api.inference import infer
from softknn_client.models import ErrorResponse, EvidenceItem, InferRequest, InferResponse
from softknn_client.types import UNSET, Response

# /v1/infer fields a retriever passes through when set (None: the server's default)
INFER_FIELDS = ("alpha", "mixing", "retrieval", "lexical_weight", "temperature", "exact", "spans")
EMBEDDING_BATCH = 64  # texts per /v1/embeddings request: the service's default limits.max_inputs


class SoftKNNError(RuntimeError):
    """The service refused or failed a request: its HTTP status and its error (type, message, field)."""

    def __init__(self, status: int, kind: str, message: str, field: str | None = None):
        super().__init__(f"softknn answered {status} {kind}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.kind, self.message, self.field = status, kind, message, field


def connect(base_url: str, api_key: str | None = None, *, timeout: float = 60.0) -> Client | AuthenticatedClient:
    """A generated client for `base_url` (the API key as bearer token when the service has one)."""
    import httpx

    if api_key:
        return AuthenticatedClient(base_url=base_url, token=api_key, timeout=httpx.Timeout(timeout))
    return Client(base_url=base_url, timeout=httpx.Timeout(timeout))


def infer_request(query: str, k: int, params: dict[str, Any]) -> InferRequest:
    """The /v1/infer body of one query: k chunks retrieved, all k returned as evidence."""
    given = {name: params[name] for name in INFER_FIELDS if params.get(name) is not None}
    return InferRequest(inputs=[query], k=k, evidence=k, **given)


def _checked(r: Response) -> InferResponse:
    if isinstance(r.parsed, InferResponse):
        return r.parsed
    if isinstance(r.parsed, ErrorResponse):
        e = r.parsed.error
        raise SoftKNNError(int(r.status_code), e.type_, e.message, e.field)
    raise SoftKNNError(int(r.status_code), "unexpected_response", r.content.decode("utf-8", "replace")[:500])


def search(client: Client | AuthenticatedClient, query: str, k: int = 4,
           **params: Any) -> tuple[str, list[EvidenceItem]]:
    """(bundle_version, the evidence items) of `query` through POST /v1/infer."""
    res = _checked(infer.sync_detailed(client=client, body=infer_request(query, k, params)))  # type: ignore[arg-type]
    return res.bundle_version, list(res.results[0].evidence)


async def asearch(client: Client | AuthenticatedClient, query: str, k: int = 4,
                  **params: Any) -> tuple[str, list[EvidenceItem]]:
    """`search`, asynchronously."""
    r = await infer.asyncio_detailed(client=client, body=infer_request(query, k, params))  # type: ignore[arg-type]
    res = _checked(r)
    return res.bundle_version, list(res.results[0].evidence)


def evidence_metadata(item: EvidenceItem, bundle_version: str) -> dict[str, Any]:
    """softknn's fields of one evidence item, as plain JSON values:

    chunk_id, doc_id, start, end (the chunk's char span in its document), label, rank (0 = the
    largest memory-mass share), w_db (the k-NN weight over the retrieved set), similarity (s_c,
    what it was ranked by), dense_similarity (e_q·e_c), bm25 (null: dense retrieval),
    matched_terms, mass_share, influence, spans (the words that drew the weight: start, end, text,
    weight, share), chunk_metadata (the KB record's own metadata) and bundle_version."""
    md = item.metadata.additional_properties if item.metadata is not UNSET else {}
    return {
        "chunk_id": item.chunk_id, "doc_id": item.doc_id, "start": item.start, "end": item.end,
        "label": item.label, "rank": item.rank, "w_db": item.weight, "similarity": item.similarity,
        "dense_similarity": item.dense_similarity, "bm25": item.bm25, "matched_terms": item.matched_terms,
        "mass_share": item.mass_share, "influence": item.influence,
        "spans": [{"start": s.start, "end": s.end, "text": s.text, "weight": s.weight, "share": s.share}
                  for s in item.spans],
        "chunk_metadata": dict(md), "bundle_version": bundle_version,
    }


def batches(texts: Sequence[str], size: int = EMBEDDING_BATCH) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


def _embedding_body(batch: list[str], model: str | None, softknn: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"input": batch, "encoding_format": "float"}
    if model:
        body["model"] = model
    if softknn:
        body["softknn"] = softknn
    return body


def _vectors(r) -> list[list[float]]:
    if r.status_code != 200:
        err = _error_of(r)
        raise SoftKNNError(r.status_code, err.get("type", "http_error"), err.get("message", r.text[:500]),
                           err.get("field"))
    return [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]


def embed(client: Client | AuthenticatedClient, texts: Sequence[str], *, model: str | None = None,
          softknn: dict[str, Any] | None = None) -> list[list[float]]:
    """POST /v1/embeddings (OpenAI's schema) in batches, through the generated client's HTTP client."""
    http = client.get_httpx_client()
    return [v for batch in batches(texts) for v in _vectors(http.post("/v1/embeddings",
                                                                       json=_embedding_body(batch, model, softknn)))]


async def aembed(client: Client | AuthenticatedClient, texts: Sequence[str], *, model: str | None = None,
                 softknn: dict[str, Any] | None = None) -> list[list[float]]:
    """`embed`, asynchronously."""
    http = client.get_async_httpx_client()
    out: list[list[float]] = []
    for batch in batches(texts):
        out += _vectors(await http.post("/v1/embeddings", json=_embedding_body(batch, model, softknn)))
    return out


def _error_of(r) -> dict[str, Any]:
    try:
        err = r.json().get("error")
    except ValueError:
        return {}
    return err if isinstance(err, dict) else {}
