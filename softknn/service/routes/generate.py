"""POST /v1/generate: generation with the KB in the generator's attention, one JSON answer or
server-sent events. The body model carries this app's limits, so the router is built per app."""

# No `from __future__ import annotations`: FastAPI must see the body model class itself (deps.body_model).

from collections.abc import AsyncGenerator
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from softknn.common.errors import SoftKNNError
from softknn.generate.engine import GenAnswer
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBsDep, RequestIdDep, body_model
from softknn.service.errors import ServiceError, error_body, status_of
from softknn.service.routes.infer import FastJSONResponse
from softknn.service.schemas import (
    ErrorResponse,
    GenerateRequestBase,
    GenerateResponse,
    generation_payload,
)

ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 422, 429, 503)}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of the events


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


def error_event(e: BaseException) -> bytes:
    """An error after the stream began (status 200 already sent): one event in the error shape."""
    if isinstance(e, SoftKNNError | ServiceError):
        return sse(error_body(e.kind, e.message, e.field))
    return sse(error_body("internal_error", "internal error; see the server log for this request id"))


class EventStream(StreamingResponse):
    """text/event-stream whose iterator is always closed when the response ends, a client gone
    included (closing it cancels the generation at its next token and frees its slot)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncGenerator[bytes, None], **kw):
        super().__init__(content, headers=SSE_HEADERS, **kw)
        self.events = content  # the body iterator itself (an async iterable is used as it is)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.events.aclose()


async def first_item(stream: AsyncGenerator[T, None]) -> T:
    """The stream's first item, so a refusal before the first token (queue full, bad messages)
    leaves as an ordinary error response, not as an event."""
    try:
        return await anext(stream)
    except BaseException:
        await stream.aclose()
        raise


def build_router(GenerateRequest: type[GenerateRequestBase]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["generation"])

    @router.post("/generate", response_model=GenerateResponse, responses={
        **ERRORS, 200: {"content": {"text/event-stream": {"schema": {"type": "string", "description":
                        'stream: one `data: {"token": id, "text": piece}` event per token, then `data: <the answer '
                        'object>`, then `data: [DONE]`'}}}}},
                 summary="Generate with the KB in the generator's attention, with evidence")
    @body_model(GenerateRequest)
    async def generate(body: GenerateRequestBase, kbs: KBsDep, who: ReaderDep, request_id: RequestIdDep):
        """409 generator_unavailable when the bundle was built without a generator; 429 when
        `generator.max_concurrent` generations run and `generator.max_queue` wait."""
        runtime = kbs.pick(body.kb, who)
        ge = runtime.generation()
        params = body.gen_params(body.max_tokens)
        prompt, messages = body.chat()
        if not body.stream:
            answer = await runtime.answer(ge, params, prompt, messages, request_id=request_id)
            return FastJSONResponse(generation_payload(request_id, ge, answer))
        stream = runtime.generate(ge, params, prompt, messages, request_id=request_id)
        first = await first_item(stream)

        async def events() -> AsyncGenerator[bytes, None]:
            try:
                item = first
                while True:
                    if isinstance(item, GenAnswer):
                        yield sse(generation_payload(request_id, ge, item))
                        break
                    yield sse({"token": item.token_id, "text": item.text})
                    item = await anext(stream)
            except (SoftKNNError, ServiceError) as e:
                yield error_event(e)
            finally:
                await stream.aclose()
            yield DONE

        return EventStream(events())

    return router


__all__ = ["DONE", "EventStream", "build_router", "error_event", "first_item", "sse", "status_of"]
