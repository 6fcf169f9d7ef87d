"""What every route group's models share: strict request config, the text and integer types, the
error shape, and `Served` (which model and bundle answered)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from softknn.common.table import MAX_SPANS, MAX_TEMPERATURE, MIN_TEMPERATURE  # noqa: F401 (re-exported)

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

def check_text(s: str) -> str:
    if not s.strip():
        raise PydanticCustomError("empty_text", "text must contain at least one non-whitespace character")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_text", "text is not valid Unicode (lone surrogate escape)") from None
    return s


# The pattern documents check_text's rule in the OpenAPI schema: \S, at least one non-whitespace
# character (JSON Schema patterns search, unanchored). Validation stays in check_text, with its message.
# Found by tests/reliability/test_fuzz.py: a blank text was schema-valid but refused.
Text = Annotated[str, AfterValidator(check_text), Field(json_schema_extra={"pattern": r"\S"})]


def integral(v: Any) -> Any:
    """4.0 → 4: JSON Schema's "integer" is any number with a zero fractional part (2020-12 core §4.2.1), and
    JSON writers such as Python's emit 4.0 for a float that holds 4. 4.5, NaN, ±inf stay floats and
    are refused by strict int validation. Found by tests/reliability/test_fuzz.py ({"evidence": 1.0})."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


Int = Annotated[int, BeforeValidator(integral)]


def _stop(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


Stop = Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_stop),
                 Field(max_length=16, description="a string or up to 16 strings; the answer ends before the first")]
KB_DOC = ("the KB to use, by name; empty = the only KB this key may use, else the one named `default` "
          "(a name this key may not use answers 404 as one that does not exist)")


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChunkRef(Out):
    """A KB chunk and where it comes from: what an evidence item and an entry both name."""

    chunk_id: str
    doc_id: str
    text: str = Field(description="the chunk's text")
    start: int = Field(description="char span [start, end) of the chunk in its document")
    end: int
    label: str | None
    metadata: dict[str, Any]


SOURCES_DOC = ("where each parameter's value came from: request (the request or the command's option), settings "
               "(the server's SOFTKNN_DEFAULTS__* / SOFTKNN_GENERATE__*), bundle (its calibration or its indexes) or "
               "default (the parameter's declared default)")


class Served(Out):
    request_id: str
    model: str = Field(description="serving model name")
    model_fingerprint: str = Field(description="sha256 over the model's weights")
    bundle_version: str = Field(description="version_id of the bundle that answered")


class ErrorDetail(BaseModel):
    type: str = Field(description="snake_case kind, e.g. validation_error, queue_full, bundle_error")
    message: str
    field: str | None = Field(description="offending input, e.g. 'inputs[2]' or 'k'")


class ErrorResponse(BaseModel):
    error: ErrorDetail


def served(request_id: str, engine) -> dict:
    info = engine.encoder.info
    return {"request_id": request_id, "model": info.name, "model_fingerprint": info.fingerprint,
            "bundle_version": engine.bundle.version}
