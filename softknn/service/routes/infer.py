"""POST /v1/infer: the body's parameters filled by the one step every door shares (softknn.params.infer_params)."""

# No `from __future__ import annotations`: FastAPI must see the body model class itself. The class is
# derived from the parameter table (schemas.InferRequest): the endpoint is annotated with its base
# class for the type checker, and deps.body_model sets the class itself for FastAPI.

from typing import Any

from fastapi import APIRouter

from softknn.common.table import InferParams
from softknn.params import infer_params
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBsDep, RequestIdDep, SettingsDep, body_model
from softknn.service.responses import FastJSONResponse
from softknn.service.schemas import ErrorResponse, InferBody, InferRequest, InferResponse, given, served

ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 422, 429, 503)}

router = APIRouter(prefix="/v1", tags=["inference"])


@router.post("/infer", response_model=InferResponse, responses=ERRORS,
             summary="Knowledge-augmented inference with evidence")
@body_model(InferRequest)
async def infer(body: InferBody, kbs: KBsDep, who: ReaderDep, settings: SettingsDep,
                request_id: RequestIdDep) -> FastJSONResponse:
    runtime = kbs.pick(body.kb, who)
    params = infer_params(settings, given(body, InferParams))
    engine, results = await runtime.infer(body.inputs, [params] * len(body.inputs), truncate=params.truncate,
                                          cut=body.cut, request_id=request_id)
    # The engine's typed results (softknn.infer.results), rendered by orjson as they are: documented by
    # InferResponse and checked against it by the contract tests; validating hundreds of
    # thousands of floats per response on the event loop buys nothing.
    return FastJSONResponse({**served(request_id, engine), "results": results})
