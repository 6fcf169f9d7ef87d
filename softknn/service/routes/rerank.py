"""POST /v1/rerank: text-embeddings-inference's rerank schema, scored with the retrieval's similarity.

Each text's score is what the retrieval would rank it by were it a chunk of the KB: the hybrid of
the dense cosine and BM25 with the KB's lexical statistics and λ (softknn.retrieval.rerank; docs/design.md,
"Rerank"). The similarity's parameters are filled by the one step every door shares (softknn.params.infer_params)."""

# No `from __future__ import annotations`: FastAPI must see the body model class itself (deps.body_model).

from typing import Any

from fastapi import APIRouter

from softknn.common.table import InferParams
from softknn.params import infer_params
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBsDep, RequestIdDep, SettingsDep, body_model
from softknn.service.responses import FastJSONResponse
from softknn.service.schemas import ErrorResponse, Rank, RerankBody, RerankRequest, given

ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 422, 429, 503)}

router = APIRouter(prefix="/v1", tags=["inference"])


@router.post("/rerank", response_model=list[Rank], responses=ERRORS,
             summary="Rerank texts for a query by the retrieval's similarity (TEI's schema)")
@body_model(RerankRequest)
async def rerank(body: RerankBody, kbs: KBsDep, who: ReaderDep, settings: SettingsDep,
                 request_id: RequestIdDep) -> FastJSONResponse:
    """One `{index, score}` per text (with `text` when return_text), by score high to low, ties
    by index; `top_n` keeps the best n. The bundle's retrieval decides the similarity: hybrid
    where it has a lexical index (λ as calibrated), else dense (`retrieval` overrides it)."""
    runtime = kbs.pick(body.kb, who)
    params = infer_params(settings, given(body, InferParams))
    _, s = await runtime.rerank(body.query, body.texts, params, truncate=params.truncate, raw=body.raw_scores,
                                request_id=request_id)
    order = sorted(range(len(s)), key=lambda i: (-s[i], i))
    if body.top_n is not None:
        order = order[: body.top_n]
    out: list[dict[str, Any]] = [{"index": i, "score": float(s[i])} for i in order]
    if body.return_text:
        for item in out:
            item["text"] = body.texts[item["index"]]
    return FastJSONResponse(out)
