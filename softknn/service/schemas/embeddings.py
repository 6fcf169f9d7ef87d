"""The OpenAI-compatible POST /v1/embeddings: the request model (OpenAI's fields, softknn's in its `softknn`
object, those of the augmented embedding the table's: softknn.common.table.InferParams) and the answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from softknn.common.errors import InputTooLarge, InvalidInput
from softknn.common.table import InferParams
from softknn.service.schemas.common import KB_DOC, STRICT, Int, Out, check_text
from softknn.service.schemas.infer import cut_texts
from softknn.service.schemas.table import app_settings, derived, given, request_fields

# the /v1/infer parameters an augmented embedding takes (its evidence is not returned)
AUGMENT_FIELDS = ("alpha", "mixing", "k", "knn_temperature", "kernel", "exact", "threshold", "retrieval", "lexical_weight")


class EmbeddingOptionsBody(BaseModel):
    model_config = STRICT

    augmented: bool = Field(False, description="false: the plain model's embedding; true: the knowledge-augmented "
                            "one (/v1/infer's `embedding` with the parameters below)")


EmbeddingOptions = derived(
    "EmbeddingOptions", EmbeddingOptionsBody,
    "softknn's extension: `augmented: true` returns the knowledge-augmented embedding (the fused memory layer, as "
    "/v1/infer's `embedding`) with these retrieval parameters; `truncate` cuts over-long inputs instead of "
    "refusing them (413).", request_fields(InferParams, *AUGMENT_FIELDS, "truncate"))


def _no_token_ids(v: Any) -> Any:
    """Token-id input (an array of integers, or of such arrays) is OpenAI's too, but ids of which
    tokenizer is the caller's guess: refused, plainly."""
    if isinstance(v, list) and v and all(isinstance(x, int) or (isinstance(x, list) and all(isinstance(y, int) for y in x))
                                         for x in v) and not all(isinstance(x, str) for x in v):
        raise InvalidInput("token-id input (arrays of integers) is not supported: send the text, a string or a "
                           "list of strings", field="input")
    return v


class EmbeddingRequest(BaseModel):
    """OpenAI-compatible embeddings of one text or a list of texts."""

    model_config = STRICT

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text or 1..limits.max_inputs (64 by default) texts, each non-empty and ≤ limits.max_chars "
                    "(20000 by default) characters and the model's token limit (or softknn.truncate); token-id "
                    "arrays are refused")
    model: str | None = Field(None, description="the embedding model's id (GET /v1/models lists it); "
                              "empty = it; another → 404 model_not_found")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: a list of numbers; base64: the little-endian float32 bytes, base64-encoded")
    dimensions: Int | None = Field(None, description="the model's dimension or null: truncated (Matryoshka) "
                                   "embeddings are not served, another value is refused (422)")
    user: str | None = Field(None, max_length=256, description="accepted, not used")
    softknn: EmbeddingOptions | None = Field(None, description="softknn's extension: the knowledge-augmented "  # type: ignore[valid-type]
                                             "embedding, truncation")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)
    _cut: list[int] = PrivateAttr(default_factory=list)

    @field_validator("input", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        v = _no_token_ids(v)
        limit = app_settings().limits.max_inputs
        if isinstance(v, list) and len(v) > limit:
            raise InputTooLarge(f"{len(v)} inputs, more than the limit {limit}", field="input")
        return v

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)  # type: ignore[arg-type]  # str only, after validation

    @property
    def augmented(self) -> bool:
        return self.softknn is not None and self.softknn.augmented

    @property
    def truncate(self) -> bool:
        return self.softknn is not None and bool(self.softknn.truncate)

    def given(self) -> dict[str, Any]:
        """The augmented embedding's parameters the request gives (none unless augmented)."""
        return given(self.softknn, InferParams) if self.softknn is not None else {}

    @model_validator(mode="after")
    def _texts(self) -> EmbeddingRequest:
        texts = self.texts
        if not texts:
            raise InvalidInput("input is empty: send a text or a non-empty list of texts", field="input")
        field = "input" if isinstance(self.input, str) else "input[{i}]"
        for i, t in enumerate(texts):
            try:
                check_text(t)
            except PydanticCustomError as e:
                where = field.format(i=i)
                raise InvalidInput(f"{where}: {e.message()}", field=where) from None
        self._cut = cut_texts(texts, self.truncate, field, "send softknn.truncate=true to cut it")
        if self._cut:
            self.input = texts if isinstance(self.input, list) else texts[0]
        if not self.augmented:
            sent: list[str] = sorted(self.softknn.model_fields_set - {"augmented", "truncate"}) if self.softknn else []
            if sent:
                raise InvalidInput(f"softknn.{sent[0]} applies to the augmented embedding only: send "
                                   "softknn.augmented=true, or leave it out", field=f"softknn.{sent[0]}")
        return self


class EmbeddingData(Out):
    object: Literal["embedding"]
    index: int = Field(description="position of the text in `input`")
    embedding: list[float] | str = Field(description="the pooled, normalised sentence embedding: numbers, or "
                                         "(encoding_format base64) its little-endian float32 bytes in base64")


class EmbeddingUsage(Out):
    prompt_tokens: int = Field(description="tokens the model ran on, special tokens included, after any cut "
                               "(the encoder's tokenizer)")
    total_tokens: int


class EmbeddingExtra(Out):
    request_id: str
    augmented: bool = Field(description="true: knowledge-augmented embeddings (the fused memory layer)")
    bundle_version: str | None = Field(description="the bundle the augmented embeddings drew on (null: plain)")


class EmbeddingResponse(Out):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    softknn: EmbeddingExtra
