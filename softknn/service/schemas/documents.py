"""PUT/DELETE/GET /v1/documents/{doc_id} and POST /v1/admin/compact: KB writes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from softknn.service.schemas.common import Out, Served
from softknn.service.schemas.index import BundleSummary


def _label(v: Any) -> Any:
    """A string or an integer, as the builder reads a label: never a boolean read as 0 or 1."""
    if v is not None and (isinstance(v, bool) or not isinstance(v, str | int)):
        raise PydanticCustomError("label_type", "must be a string or an integer")
    return v


class DocumentRequest(BaseModel):
    """A KB record without its id, as the builder reads one: fields other than these become metadata."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    text: str = Field(min_length=1, description="the document's text; its chunks replace the old ones")
    label: Annotated[str | int | None, BeforeValidator(_label)] = Field(
        None, description="the document's label (a labelled KB's class)")
    metadata: dict[str, Any] | None = Field(None, description="kept with every chunk, returned with its evidence")


class DocumentChunk(Out):
    chunk_id: str
    start: int = Field(description="first char of the chunk in the document")
    end: int
    text: str


class DocumentOut(Out):
    doc_id: str
    label: str | None
    metadata: dict[str, Any]
    text: str | None = Field(description="the document's text where it is known whole: written through the API, "
                                         "or one chunk (its text is the document's, trimmed); else null")
    written: bool = Field(description="true when the document was written through the API (not by the build)")
    chunks: list[DocumentChunk]


class DocumentResponse(Served):
    document: DocumentOut


class WriteResponse(Served):
    op: Literal["put", "delete"]
    doc_id: str
    seq: int = Field(description="this write's number in the KB's write log (1, 2, …; only grows)")
    chunks: int = Field(description="the document's chunks after the write (0 after a delete)")
    created: bool = Field(description="put: the id was new to the KB")
    durable: bool = Field(True, description="always true: a write is acknowledged only once its log record is fsynced")


class CompactResponse(Served):
    writes_folded: int = Field(description="logged writes folded into the new base bundle (0: nothing to do)")
    recalibrated: bool = Field(description="a labelled KB's calibration (λ, τ, abstain thresholds) was recomputed")
    index: BundleSummary
