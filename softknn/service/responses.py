"""How the routes answer beyond a plain JSON body: orjson-rendered JSON (FastJSONResponse) and
server-sent events (EventStream and its helpers), shared by the route modules, which never import
each other."""

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import orjson
from fastapi.responses import JSONResponse, StreamingResponse

from softknn.common.errors import SoftKNNError
from softknn.service.errors import ServiceError, error_body


class FastJSONResponse(JSONResponse):
    """JSON rendered by orjson, on the event loop that every request shares: an order of magnitude
    faster than the stdlib's json on real answers (`python -m bench json_encode`; docs/benchmarks.md).
    Same values: both write floats in their shortest round-trip form, and the benchmark checks the
    decoded answers are equal."""

    def render(self, content) -> bytes:
        return orjson.dumps(content)


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


def event_stream(stream: AsyncGenerator[T, None], first: T,
                 render: Callable[[AsyncIterator[T]], AsyncIterator[bytes]]) -> EventStream:
    """A generation's server-sent events: `render` turns its items (`first`, already read by first_item,
    then the rest of `stream`) into events; an error after the first becomes an error event, `stream`
    is closed however the response ends, and [DONE] comes last."""

    async def items() -> AsyncIterator[T]:
        yield first
        async for item in stream:
            yield item

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            async for event in render(items()):
                yield event
        except (SoftKNNError, ServiceError) as e:
            yield error_event(e)
        finally:
            await stream.aclose()
        yield DONE

    return EventStream(body())
