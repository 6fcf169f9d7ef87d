"""POST /v1/generate and the OpenAI-compatible /v1/chat/completions and /v1/models: the request models
(their generation parameters the table's: softknn.common.table.GenParams) and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from softknn.common.table import GenParams, Mixing
from softknn.service.schemas.common import (
    KB_DOC,
    SOURCES_DOC,
    STRICT,
    Int,
    Out,
    Served,
    Text,
    served,
)
from softknn.service.schemas.infer import Evidence, QueryToken, Span
from softknn.service.schemas.table import app_settings, at_most, derived, given, limit_text, request_fields


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "user", "assistant"] = Field(description="who said it; the KB goes at the head of the "
                                                         "last user message")
    content: str = Field(description="the message's text")


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ChatCompletionMessage(BaseModel):
    """An OpenAI chat message: text content, or a list of text parts (joined)."""

    model_config = ConfigDict(extra="ignore", strict=True)  # e.g. `name`: accepted, not used

    role: Literal["system", "developer", "user", "assistant"] = Field(description="developer is read as system")
    content: str | list[TextPart] = Field(description="text, or text parts joined in order")

    def plain(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = Field(False, description="a last chunk with `usage` (and no choices) before [DONE]")


STREAM_DOC = "server-sent events, one per token, instead of one JSON answer"


def _max_chars(v: str) -> str:
    if len(v) > (limit := app_settings().limits.max_chars):
        raise PydanticCustomError("string_too_long", "String should have at most {max_length} characters",
                                  {"max_length": limit})
    return v


class GenerateBody(BaseModel):
    """The fields of /v1/generate that are not GenParams': the question and how it is answered."""

    model_config = STRICT

    prompt: Annotated[Text, AfterValidator(_max_chars)] | None = Field(None, description="a question: one user turn through the generator's chat template, "
                                "as `messages` with one user message would be (raw: text the model continues, "
                                "tokenised as it is, the KB before it); ≤ limits.max_chars (20000 by default) "
                                "characters")
    raw: bool = Field(False, description="true: `prompt` is raw text to continue (no chat template)")
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256, description="a chat, through "
                                               "the generator's chat template; the KB at the head of the last user "
                                               "message")
    stream: bool = Field(False, description=STREAM_DOC)
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    @model_validator(mode="after")
    def _one_of(self):
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError("prompt_or_messages", "give exactly one of prompt (a question) and messages (chat)")
        if self.raw and self.prompt is None:
            raise PydanticCustomError("raw_needs_prompt", "raw applies to prompt, not to messages")
        return self

    def chat(self) -> tuple[str | None, list[dict] | None]:
        """(raw prompt, messages) for GenEngine: a prompt is one user turn unless raw."""
        if self.messages is not None:
            return None, [m.model_dump() for m in self.messages]
        return (self.prompt, None) if self.raw else (None, [{"role": "user", "content": self.prompt}])

    def given(self) -> dict[str, Any]:
        return given(self, GenParams)


GenerateRequest = derived(
    "GenerateRequest", GenerateBody, "Generation with the KB in the generator's attention: exactly one of `prompt` "
    "and `messages`; a generation parameter left unset takes the server's setting (SOFTKNN_GENERATE__*), else "
    "the bundle's own, else the default it names.", request_fields(GenParams, nullable=("stop",)))

Tokens = Annotated[Int, Field(ge=1), at_most("generator.max_tokens")]


class ChatBody(BaseModel):
    """The fields of /v1/chat/completions that are OpenAI's."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str | None = Field(None, description="the served generator's id (GET /v1/models); empty = it")
    messages: list[ChatCompletionMessage] = Field(min_length=1, max_length=256)
    max_completion_tokens: Tokens | None = Field(None, description="as max_tokens (wins)"
                                                 + limit_text("generator.max_tokens"))
    n: Int = Field(1, ge=1, le=1, description="choices per request: 1 only")
    stream: bool = Field(False, description=STREAM_DOC)
    stream_options: StreamOptions | None = Field(None, description="streaming: include_usage")
    user: str | None = Field(None, max_length=256, description="accepted, not used")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    def given(self) -> dict[str, Any]:
        out = given(self, GenParams)
        if self.max_completion_tokens is not None:
            out["max_tokens"] = self.max_completion_tokens
        return out


ChatRequest = derived(
    "ChatCompletionRequest", ChatBody, "OpenAI-compatible chat completion with the KB in the generator's attention; "
    "softknn's generation parameters are extra top-level fields (the openai client's `extra_body`), unset as "
    "/v1/generate's.", request_fields(GenParams, nullable=("stop", "max_tokens")))


class Usage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class GenSpan(Span):
    """A Span of a generated answer's evidence: the same fields (this name kept for the clients that use it)."""


class GenEvidenceItem(Evidence):
    """The evidence of a generated answer: EvidenceItem's fields, rank from 0 (this name kept for the clients
    that use it)."""

    influence: float | None = Field(description="null: no closed form over the decode")
    spans: list[GenSpan]
    query_tokens: list[QueryToken] = Field(description="the generated tokens that drew on it most (≤ 3)")
    tokens: list[int] = Field(description="indexes into `tokens` of the generated tokens that drew on it most "
                              "(query_tokens' indexes)")


class GenTokenItem(Out):
    index: int
    text: str = Field(description="the text this token added")
    memory_share: float = Field(description="Σ_c g_c for the step that produced it (0 without memory)")
    top_chunk: str | None = Field(description="the chunk it drew on most")


class GroundingDiagnostics(Out):
    grounded: bool | None = Field(description="null: not judged (no retrieval, or a bundle without a refusal threshold)")
    refused: bool = Field(description="the answer is the refusal text; nothing was decoded")
    signal: str | None = Field(description="what was thresholded: nearest_similarity, the nearest KB chunk's dense "
                               "similarity e_q·e_c")
    value: float | None = Field(description="the signal's value for this question")
    threshold: float | None = Field(description="the bundle's refusal threshold (null: it has none)")
    note: str


class GenDiagnostics(Out):
    memory_share: float = Field(description="mean over generated tokens of the memory's attention mass")
    retrieved: int
    k: int
    mixing: Mixing | None = Field(description="null: no memory (use_kb false, prompt context)")
    alpha: float | None
    positions: str
    retrieval: str | bool | None = Field(description="the similarity R was ranked by (null: no retrieval)")
    memory_layers: int
    memory_tokens: int
    memory_source: str = Field(description="stored fp32/fp16/int8/q4/q2, recomputed, prompt or none")
    prior: float | None = Field(None, description="β of the k-NN prior (joint mixing; null otherwise)")
    defaults: Literal["calibrated", "fixed"] | None = Field(None, description="where k and β came from when the "
                                                            "request left them unset: the bundle's calibration or "
                                                            "the fixed defaults")
    runtime: str | None = Field(None, description="what decoded: `graph w8a8 int8 kernel` (the decode graph: its "
                                "weights, KV cache and attention, generator.attention) or `torch` (the memory "
                                "hook: fixed α, exact)")
    w_db_entropy: float
    w_db_effective_k: float
    attention_effective_k: float
    exact: bool
    filtered: int | None = Field(description="chunks that pass the request's filter (null: no filter or no retrieval)")
    grounding: GroundingDiagnostics | None = Field(None, description="the refusal verdict and why")
    sources: dict[str, str] = Field(default_factory=dict, description=SOURCES_DOC)


GROUNDED_DOC = ("false: the KB does not hold an answer (the nearest chunk is below the bundle's refusal threshold); "
                "the text is then the refusal text unless the request sent refuse false. null: not judged (use_kb "
                "false, or a bundle built without a refusal threshold)")


class GenerateResponse(Served):
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    grounded: bool | None = Field(description=GROUNDED_DOC)
    usage: Usage
    evidence: list[GenEvidenceItem]
    diagnostics: GenDiagnostics
    tokens: list[GenTokenItem]
    generator: str = Field(description="the generator's name")


class ChatChoiceMessage(Out):
    role: Literal["assistant"]
    content: str


class ChatChoice(Out):
    index: int
    message: ChatChoiceMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class SoftknnExtra(Out):
    request_id: str
    bundle_version: str
    grounded: bool | None = Field(description=GROUNDED_DOC)
    evidence: list[GenEvidenceItem]
    diagnostics: GenDiagnostics
    tokens: list[GenTokenItem]


class ChatCompletion(Out):
    id: str = Field(description="chatcmpl-<request id>")
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = Field(description="the bundle version")
    choices: list[ChatChoice]
    usage: Usage
    softknn: SoftknnExtra = Field(description="evidence and diagnostics of the answer")


class ModelCard(Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Out):
    object: Literal["list"]
    data: list[ModelCard]


def generation_payload(request_id: str, ge, answer) -> dict:
    return {**served(request_id, ge), **answer.to_dict()}
