"""One error taxonomy, one status map, one JSON shape (DESIGN.md "Errors"; TEI's habit).

Every error the service answers — domain errors from the core, the service's own refusals,
FastAPI's validation errors, Starlette's 404/405, malformed JSON, a body over the limit, an
unexpected exception — leaves as

    {"error": {"type": "<snake_case kind>", "message": "<what and why>", "field": "<input path> | null"}}

with the status from `STATUS` (looked up along the exception's MRO).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from softknn.common.errors import (
    BundleError,
    DocumentNotFound,
    InputTooLarge,
    InvalidInput,
    KBFormatError,
    ModelRuntimeError,
    ShardUnavailable,
    SoftKNNError,
    UnsupportedModel,
    WriteRefused,
)

log = logging.getLogger("softknn.service")


class ServiceError(Exception):
    """A refusal by the service itself (not the core); `kind` and the status come from the class."""

    kind = "service_error"

    def __init__(self, message: str, *, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}


class NotReady(ServiceError):
    kind = "not_ready"


class QueueFull(ServiceError):
    kind = "queue_full"


class DeadlineExceeded(ServiceError):
    kind = "timeout"


class ShuttingDown(ServiceError):
    kind = "shutting_down"


class StartupFailed(ServiceError):
    kind = "startup_failed"


class InferenceFailed(ServiceError):
    """The engine raised something that is not a domain error: a bug, logged with its traceback."""

    kind = "inference_error"


class Unauthorized(ServiceError):
    kind = "unauthorized"


class Forbidden(ServiceError):
    kind = "forbidden"


class NotFound(ServiceError):
    kind = "not_found"


class Conflict(ServiceError):
    kind = "conflict"


class GeneratorUnavailable(Conflict):
    """/v1/generate, /v1/chat/completions on a bundle built without a generator (or one that did not load)."""

    kind = "generator_unavailable"


class ModelNotFound(NotFound):
    """/v1/chat/completions naming a model other than the served generator, /v1/embeddings one other
    than the embedding model."""

    kind = "model_not_found"


class BodyTooLarge(StarletteHTTPException):
    """Raised from the body-limit middleware's receive; an HTTPException so FastAPI re-raises it as is.

    The connection stays open: uvicorn reads and discards the rest of the body after the answer, so
    the client reads its 413 (closing with unread bytes would reset the connection under it)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyTimeout(StarletteHTTPException):
    """The body did not arrive within limits.body_timeout_s (a slow-loris client); raised like BodyTooLarge.

    "Connection: close": without it the client's next trickled bytes would keep the connection open."""

    def __init__(self, seconds: float):
        super().__init__(408, f"request body not received within {seconds:g} s", headers={"Connection": "close"})


# The one map from error class to HTTP status. Subclasses not listed inherit their parent's.
STATUS: dict[type[Exception], int] = {
    InvalidInput: 422,
    InputTooLarge: 413,
    BundleError: 422,  # a reload naming a corrupt/foreign bundle: the request's bundle is unusable
    KBFormatError: 422,
    UnsupportedModel: 500,  # server configuration, never the client's fault
    ShardUnavailable: 503,  # a KB shard's actor died and is restarting (softknn.storage.ray_shards): Retry-After
    ModelRuntimeError: 500,
    WriteRefused: 409,  # a KB write this bundle does not support (sharded, generator memory)
    DocumentNotFound: 404,  # model.runtime: an export that fails verification, a bad setting
    SoftKNNError: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    QueueFull: 429,
    NotReady: 503,
    DeadlineExceeded: 503,
    ShuttingDown: 503,
    StartupFailed: 503,
    ServiceError: 500,
}

HTTP_KINDS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


# FastAPI's detail when reading the JSON body raised something other than JSONDecodeError (the
# original exception is its __cause__): invalid UTF-8, nesting past the recursion limit, an integer
# literal past Python's digit limit. Answered as malformed_json like any other unparsable body.
FASTAPI_PARSE_ERROR = "There was an error parsing the body"


def parse_failure(cause: BaseException) -> str:
    """Why the body could not be parsed, in words (tests/reliability/test_hostile.py)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    return f"{type(cause).__name__}: {cause}"


def status_of(exc: Exception) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(kind: str, message: str, field: str | None = None) -> dict:
    return {"error": {"type": kind, "message": message, "field": field}}


# The OpenAI-compatible routes answer the same shape with OpenAI's two extra keys, `param` (= field)
# and `code` (= type), so the openai client's exceptions carry them: a superset of both shapes.
OPENAI_PATHS = ("/v1/chat/completions", "/v1/embeddings", "/v1/models")


def error_response(status: int, kind: str, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None, *, openai: bool = False) -> JSONResponse:
    body = error_body(kind, message, field)
    if openai:
        body["error"].update(param=field, code=kind)
    return JSONResponse(body, status_code=status, headers=headers)


def _openai(request: Request) -> bool:
    return request.url.path in OPENAI_PATHS


def field_path(loc: tuple | list) -> str | None:
    """("body", "inputs", 2) -> "inputs[2]"; ("query", "k") -> "k"; the location kind is dropped."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def validation_response(exc: RequestValidationError, *, openai: bool = False) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        e = next(e for e in errors if e.get("type") == "json_invalid")
        detail = (e.get("ctx") or {}).get("error", "")
        pos = e["loc"][1] if len(e.get("loc", ())) > 1 else "?"
        return error_response(400, "malformed_json", f"request body is not valid JSON: {detail} at char {pos}",
                              openai=openai)
    parts = []
    for e in errors:
        f = field_path(e.get("loc", ()))
        parts.append(f"{f or 'request body'}: {e.get('msg')}")  # no field: the body itself (missing, not an object)
    first = field_path(errors[0].get("loc", ())) if errors else None
    return error_response(422, "validation_error", "; ".join(parts) or "invalid request", first, openai=openai)


def allowed_methods(request: Request, first: str | None) -> str:
    """Every method the service serves on this path, for a 405's Allow header. Starlette's 405 names
    only the first route that matched the path (`first`), and one path can have several (GET, PUT and
    DELETE /v1/documents/{doc_id}); the OpenAPI document lists them all (GET answers HEAD too)."""
    app = request.app
    table = getattr(app.state, "route_methods", None)
    if table is None:
        table = [(compile_path(path)[0], {m.upper() for m in ops})
                 for path, ops in app.openapi().get("paths", {}).items()]
        app.state.route_methods = table
    methods = {m.strip() for m in (first or "").split(",") if m.strip()}
    for regex, ops in table:
        if regex.match(request.url.path):
            methods |= ops | ({"HEAD"} if "GET" in ops else set())
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    """Register the handlers that turn every exception into the one shape."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc, openai=_openai(request))

    @app.exception_handler(SoftKNNError)
    async def _domain(request: Request, exc: SoftKNNError) -> JSONResponse:
        return error_response(status_of(exc), exc.kind, exc.message, exc.field, getattr(exc, "headers", None),
                              openai=_openai(request))

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(status_of(exc), exc.kind, exc.message, exc.field, exc.headers, openai=_openai(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = HTTP_KINDS.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code == 400 and exc.__cause__ is not None and message == FASTAPI_PARSE_ERROR:
            kind, message = "malformed_json", f"request body is not valid JSON: {parse_failure(exc.__cause__)}"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.url.path}"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
            headers = {**(headers or {}), "Allow": allowed_methods(request, (headers or {}).get("Allow"))}
        return error_response(exc.status_code, kind, message, headers=headers, openai=_openai(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal error; see the server log for this request id",
                              openai=_openai(request))
