"""The TEI-compatible POST /v1/rerank: the request model (TEI's fields, the similarity's parameters the
table's: softknn.common.table.InferParams) and its ranks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from softknn.common.errors import InputTooLarge
from softknn.common.table import InferParams
from softknn.service.schemas.common import KB_DOC, STRICT, Out, Text, integral
from softknn.service.schemas.infer import cut_texts
from softknn.service.schemas.table import app_settings, derived, request_fields


def count_texts(v: Any) -> Any:
    limit = app_settings().limits.max_inputs
    if isinstance(v, list) and len(v) > limit:
        raise InputTooLarge(f"{len(v)} texts, more than the limit {limit}", field="texts")
    return v


class RerankBody(BaseModel):
    """The fields of /v1/rerank that are text-embeddings-inference's (`top_n` besides)."""

    model_config = STRICT

    query: Text = Field(description="the query: non-empty, ≤ limits.max_chars (20000 by default) characters (or "
                        "truncate)")
    texts: Annotated[list[Text], BeforeValidator(count_texts)] = Field(
        min_length=1, description="1..limits.max_inputs (64 by default) non-empty texts to score")
    raw_scores: bool = Field(False, description="false: s_t, in [0, 1] (a KB chunk's text scores its retrieval "
                             "similarity); true: the same affine scores unclipped (hybrid and lexical)")
    return_text: bool = Field(False, description="return each text with its score")
    truncation_direction: Literal["right", "Right"] = Field("right", description="only right: a cut keeps "
                                                            "the beginning")
    top_n: Annotated[int, Field(ge=1), BeforeValidator(integral)] | None = Field(
        None, description="return the n best only (all: null)")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    @model_validator(mode="after")
    def _chars(self) -> RerankBody:
        truncate = getattr(self, "truncate", None)
        hint = "send truncate=true to cut it"
        texts = [self.query]
        cut_texts(texts, truncate, "query", hint)
        self.query = texts[0]
        cut_texts(self.texts, truncate, "texts[{i}]", hint)
        return self


RerankRequest = derived(
    "RerankRequest", RerankBody, "Score texts against a query with softknn's retrieval similarity (docs/design.md, "
    '"Rerank"); the similarity\'s parameters left unset (null) take the server\'s settings, else the bundle\'s own.',
    request_fields(InferParams, "retrieval", "lexical_weight", "exact", "truncate", described={
        "exact": "the dense range over every chunk instead of the ANN index's top m"}))


class Rank(Out):
    index: int = Field(description="position of the text in `texts`")
    score: float = Field(description="s_t, the retrieval's similarity for this text (docs/design.md, \"Rerank\")")
    text: str | None = Field(None, description="the text, with return_text")
