"""Pure-ASGI middleware: request context (id, metrics, access log) and the body-size limit."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from softknn.service.errors import BodyTimeout, BodyTooLarge, error_response
from softknn.service.logs import request_id_var
from softknn.service.metrics import Metrics

log = logging.getLogger("softknn.service.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
_QUIET = {"/healthz", "/readyz", "/metrics"}  # probes and scrapes log at debug level


class RequestContextMiddleware:
    """Gives each request an id (a sane incoming X-Request-ID, else a new one), echoes it in the
    response header, counts and times the request by route template, and writes one access line.

    `echo=False` behind a proxy that echoes the id itself (Ray Serve's proxy sets X-Request-ID on the
    request when it has none and adds it to every response): one header, not two."""

    def __init__(self, app: ASGIApp, metrics: Metrics, echo: bool = True):
        self.app = app
        self.metrics = metrics
        self.echo = echo

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get("x-request-id", "")
        rid = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        token = request_id_var.set(rid)
        start = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.echo:
                    MutableHeaders(scope=message).append("X-Request-ID", rid)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            dt = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", None) or "unmatched"  # template, bounded cardinality
            method = scope["method"]
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route, method).observe(dt)
            path = scope["path"]
            log.log(logging.DEBUG if path in _QUIET else logging.INFO, "%s %s %d", method, path, status,
                    extra={"request_id": rid, "method": method, "path": path, "route": route, "status": status,
                           "duration_ms": round(dt * 1e3, 2)})
            request_id_var.reset(token)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: at once from Content-Length, else while it streams in.
    408 for a body not received within `timeout_s` of the route's first read (a slow-loris client:
    uvicorn itself has no body-read timeout, so without this one connection could hold a request
    open for ever; tests/reliability/test_hostile.py).

    Not Starlette's RequestBodyLimitMiddleware: that one answers in plain text when the route
    never reads the body, and every error here leaves in the one JSON shape.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(413, "payload_too_large",
                                      f"request body of {declared} bytes is larger than the limit {self.max_bytes}")
            await response(scope, receive, send)
            return
        received, complete = 0, False
        deadline: float | None = None

        async def limited_receive() -> Message:
            nonlocal received, complete, deadline
            if complete:  # the body is in: later reads only wait for a disconnect, without a deadline
                return await receive()
            if deadline is None:
                deadline = time.monotonic() + self.timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise BodyTimeout(self.timeout_s) from None  # an HTTPException, like BodyTooLarge
            if message["type"] == "http.request":
                complete = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)  # an HTTPException: the route re-raises it as is
            return message

        await self.app(scope, limited_receive, send)
