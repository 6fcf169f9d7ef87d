"""The OpenAI-compatible POST /v1/embeddings: the request model built per app
(`embedding_request_model`; softknn's own fields in its `softknn` object) and the answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from softknn.common.errors import InputTooLarge, InvalidInput
from softknn.infer.engine import InferParams
from softknn.params import Settings, merge_alias
from softknn.service.schemas.common import KB_DOC, STRICT, Int, Out, check_text
from softknn.service.schemas.infer import infer_request_model

AUGMENT_FIELDS = ("alpha", "mixing", "k", "knn_temperature", "temperature", "kernel", "exact", "threshold", "retrieval", "lexical_weight")


class EmbeddingOptionsBase(BaseModel):
    """softknn's extension of an embeddings request (the `softknn` field); bounds set per app."""

    model_config = STRICT

    augmented: bool
    truncate: bool
    alpha: float
    mixing: Literal["fixed", "joint"]
    k: int
    knn_temperature: float | None
    temperature: float | None  # deprecated name of knn_temperature: moved there after validation
    kernel: Literal["softmax", "epanechnikov", "uniform"]
    exact: bool
    threshold: float | None
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None

    @model_validator(mode="after")
    def _tau_alias(self):
        merge_alias(self, "knn_temperature", "temperature", where="softknn.")
        return self

    def to_params(self, hybrid_pool: int, candidates: int) -> InferParams:
        """The /v1/infer parameters of the augmented embedding (no evidence: only the embedding is returned)."""
        return InferParams(alpha=self.alpha, mixing=self.mixing, k=self.k, temperature=self.knn_temperature,
                           kernel=self.kernel, exact=self.exact, threshold=self.threshold, hybrid_pool=hybrid_pool,
                           evidence=0, spans=0, truncate=self.truncate, retrieval=self.retrieval,
                           lexical_weight=self.lexical_weight, candidates=candidates)


def _no_token_ids(v: Any) -> Any:
    """Token-id input (an array of integers, or of such arrays) is OpenAI's too, but ids of which
    tokenizer is the caller's guess: refused, plainly."""
    if isinstance(v, list) and v and all(isinstance(x, int) or (isinstance(x, list) and all(isinstance(y, int) for y in x))
                                         for x in v) and not all(isinstance(x, str) for x in v):
        raise InvalidInput("token-id input (arrays of integers) is not supported: send the text, a string or a "
                           "list of strings", field="input")
    return v


class EmbeddingRequestBase(BaseModel):
    model_config = STRICT

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None
    encoding_format: Literal["float", "base64"]
    dimensions: int | None
    user: str | None
    softknn: EmbeddingOptionsBase | None
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)
    _cut: list[int] = PrivateAttr(default_factory=list)

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)  # type: ignore[arg-type]  # str only, after validation

    @property
    def truncate(self) -> bool:
        return self.softknn is not None and self.softknn.truncate


def embedding_request_model(settings: Settings) -> type[EmbeddingRequestBase]:
    """The POST /v1/embeddings body: OpenAI's fields, and softknn's in one `softknn` object
    (the openai client's `extra_body={"softknn": {...}}`)."""
    from pydantic import create_model

    lim = settings.limits
    infer = infer_request_model(settings).model_fields
    options = create_model(
        "EmbeddingOptions", __base__=EmbeddingOptionsBase,
        __doc__="softknn's extension: `augmented: true` returns the knowledge-augmented embedding (the fused "
                "memory layer, as /v1/infer's `embedding`) with these retrieval parameters; `truncate` cuts "
                "over-long inputs instead of refusing them (413).",
        augmented=(bool, Field(False, description="false: the plain model's embedding; true: the knowledge-"
                               "augmented one (/v1/infer's `embedding` with the parameters below)")),
        truncate=(bool, Field(False, description="cut inputs over the character or token limit instead of "
                              "refusing them (413)")),
        **{name: (infer[name].annotation, infer[name]) for name in AUGMENT_FIELDS},  # type: ignore[call-overload]
    )

    def count(v: Any) -> Any:
        v = _no_token_ids(v)
        if isinstance(v, list) and len(v) > lim.max_inputs:
            raise InputTooLarge(f"{len(v)} inputs, more than the limit {lim.max_inputs}", field="input")
        return v

    class EmbeddingRequest(EmbeddingRequestBase):
        """OpenAI-compatible embeddings of one text or a list of texts."""

        model_config = ConfigDict(title="EmbeddingRequest")

        input: Annotated[str | list[str] | list[int] | list[list[int]], BeforeValidator(count)] = Field(
            description=f"a text or 1..{lim.max_inputs} texts, each non-empty and ≤ {lim.max_chars} characters "
                        "and the model's token limit (or softknn.truncate); token-id arrays are refused")
        model: str | None = Field(None, description="the embedding model's id (GET /v1/models lists it); "
                                  "empty = it; another → 404 model_not_found")
        encoding_format: Literal["float", "base64"] = Field(
            "float", description="float: a list of numbers; base64: the little-endian float32 bytes, base64-encoded")
        dimensions: Int | None = Field(None, description="the model's dimension or null: truncated (Matryoshka) "
                                       "embeddings are not served, another value is refused (422)")
        user: str | None = Field(None, max_length=256, description="accepted, not used")
        softknn: options | None = Field(None, description="softknn's extension: the knowledge-augmented embedding, "  # type: ignore[valid-type]
                                        "truncation")

        @model_validator(mode="after")
        def _texts(self) -> EmbeddingRequest:
            texts = self.texts
            if not texts:
                raise InvalidInput("input is empty: send a text or a non-empty list of texts", field="input")
            for i, t in enumerate(texts):
                where = "input" if isinstance(self.input, str) else f"input[{i}]"
                try:
                    check_text(t)
                except PydanticCustomError as e:
                    raise InvalidInput(f"{where}: {e.message()}", field=where) from None
                if len(t) > lim.max_chars:
                    if not self.truncate:
                        raise InputTooLarge(f"{where} has {len(t)} characters, more than the limit {lim.max_chars}; "
                                            "send softknn.truncate=true to cut it", field=where)
                    texts[i] = t[: lim.max_chars]
                    self._cut.append(i)
            if self._cut:
                self.input = texts if isinstance(self.input, list) else texts[0]
            if self.softknn is None or not self.softknn.augmented:
                given = sorted(self.softknn.model_fields_set & set(AUGMENT_FIELDS)) if self.softknn else []
                if given:
                    raise InvalidInput(f"softknn.{given[0]} applies to the augmented embedding only: send "
                                       "softknn.augmented=true, or leave it out", field=f"softknn.{given[0]}")
            return self

    return EmbeddingRequest


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
