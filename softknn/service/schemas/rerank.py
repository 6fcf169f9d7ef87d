"""The TEI-compatible POST /v1/rerank: the request model built per app (`rerank_request_model`) and
its ranks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from softknn.common.errors import InputTooLarge
from softknn.infer.engine import InferParams
from softknn.params import Settings, param_field
from softknn.service.schemas.common import KB_DOC, STRICT, Out, Text, integral


class RerankRequestBase(BaseModel):
    model_config = STRICT

    query: str
    texts: list[str]
    raw_scores: bool
    return_text: bool
    truncate: bool
    truncation_direction: Literal["right", "Right"]
    top_n: int | None
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None
    exact: bool
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    def to_params(self, candidates: int) -> InferParams:
        return InferParams(retrieval=self.retrieval, lexical_weight=self.lexical_weight, exact=self.exact,
                           candidates=candidates, truncate=self.truncate)


def rerank_request_model(settings: Settings) -> type[RerankRequestBase]:
    """The POST /v1/rerank body (text-embeddings-inference's schema, `top_n` and the similarity's
    parameters besides) with this app's limits."""
    lim = settings.limits

    def count(v: Any) -> Any:
        if isinstance(v, list) and len(v) > lim.max_inputs:
            raise InputTooLarge(f"{len(v)} texts, more than the limit {lim.max_inputs}", field="texts")
        return v

    class RerankRequest(RerankRequestBase):
        """Score texts against a query with softknn's retrieval similarity (docs/design.md, "Rerank")."""

        model_config = ConfigDict(title="RerankRequest")

        query: Text = Field(description=f"the query: non-empty, ≤ {lim.max_chars} characters (or truncate)")
        texts: Annotated[list[Text], BeforeValidator(count)] = Field(
            min_length=1, json_schema_extra={"maxItems": lim.max_inputs},
            description=f"1..{lim.max_inputs} non-empty texts to score")
        raw_scores: bool = Field(False, description="false: s_t, in [0, 1] (a KB chunk's text scores its retrieval "
                                 "similarity); true: the same affine scores unclipped (hybrid and lexical)")
        return_text: bool = Field(False, description="return each text with its score")
        truncate: bool = Field(False, description="cut texts over the character or token limit instead of refusing "
                               "them (413)")
        truncation_direction: Literal["right", "Right"] = Field("right", description="only right: a cut keeps "
                                                                "the beginning")
        top_n: Annotated[int, Field(ge=1), BeforeValidator(integral)] | None = Field(
            None, description="return the n best only (all: null)")
        retrieval: Literal["hybrid", "dense", "lexical"] | None = param_field(
            "retrieval", settings.defaults.retrieval, description="the similarity: hybrid, dense or lexical, as "
            "/v1/infer's; null = hybrid where the bundle has a lexical index, else dense")
        lexical_weight: float | None = param_field("lexical_weight", settings.defaults.lexical_weight,
                                                   description="λ of the hybrid similarity; null = the λ the "
                                                   "bundle's build chose or the default")
        exact: bool = param_field("exact", description="the dense range over every chunk instead of the ANN "
                                  "index's top m")

        @model_validator(mode="after")
        def _chars(self) -> RerankRequest:
            if len(self.query) > lim.max_chars:
                if not self.truncate:
                    raise InputTooLarge(f"query has {len(self.query)} characters, more than the limit "
                                        f"{lim.max_chars}; send truncate=true to cut it", field="query")
                self.query = self.query[: lim.max_chars]
            for i, t in enumerate(self.texts):
                if len(t) > lim.max_chars:
                    if not self.truncate:
                        raise InputTooLarge(f"texts[{i}] has {len(t)} characters, more than the limit "
                                            f"{lim.max_chars}; send truncate=true to cut it", field=f"texts[{i}]")
                    self.texts[i] = t[: lim.max_chars]
            return self

    return RerankRequest


class Rank(Out):
    index: int = Field(description="position of the text in `texts`")
    score: float = Field(description="s_t, the retrieval's similarity for this text (docs/design.md, \"Rerank\")")
    text: str | None = Field(None, description="the text, with return_text")
