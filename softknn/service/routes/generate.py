"""POST /v1/generate: generation with the KB in the generator's attention, one JSON answer or
server-sent events; the body's parameters filled by the one step every door shares (softknn.params.gen_params)."""

# No `from __future__ import annotations`: FastAPI must see the body model class itself (deps.body_model).

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter

from softknn.generate.engine import GenAnswer
from softknn.generate.model import Step
from softknn.params import gen_params
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBsDep, RequestIdDep, SettingsDep, body_model
from softknn.service.errors import status_of
from softknn.service.responses import DONE, EventStream, FastJSONResponse, error_event, event_stream, first_item, sse
from softknn.service.schemas import (
    ErrorResponse,
    GenerateBody,
    GenerateRequest,
    GenerateResponse,
    generation_payload,
)

ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 422, 429, 503)}

router = APIRouter(prefix="/v1", tags=["generation"])


@router.post("/generate", response_model=GenerateResponse, responses={
    **ERRORS, 200: {"content": {"text/event-stream": {"schema": {"type": "string", "description":
                    'stream: one `data: {"token": id, "text": piece}` event per token, then `data: <the answer '
                    'object>`, then `data: [DONE]`'}}}}},
             summary="Generate with the KB in the generator's attention, with evidence")
@body_model(GenerateRequest)
async def generate(body: GenerateBody, kbs: KBsDep, who: ReaderDep, settings: SettingsDep, request_id: RequestIdDep):
    """409 generator_unavailable when the bundle was built without a generator; 429 when
    `generator.max_concurrent` generations run and `generator.max_queue` wait."""
    runtime = kbs.pick(body.kb, who)
    ge = runtime.generation.current()
    params = gen_params(settings, body.given())
    prompt, messages = body.chat()
    if not body.stream:
        answer = await runtime.generation.answer(ge, params, prompt, messages, request_id=request_id)
        return FastJSONResponse(generation_payload(request_id, ge, answer))
    stream = runtime.generation.generate(ge, params, prompt, messages, request_id=request_id)
    first = await first_item(stream)

    async def events(items: AsyncIterator[Step | GenAnswer]) -> AsyncIterator[bytes]:
        async for item in items:  # each token, then the answer
            if isinstance(item, GenAnswer):
                yield sse(generation_payload(request_id, ge, item))
            else:
                yield sse({"token": item.token_id, "text": item.text})

    return event_stream(stream, first, events)


__all__ = ["DONE", "EventStream", "error_event", "first_item", "router", "sse", "status_of"]
