"""POST /v1/generate and the OpenAI-compatible /v1/chat/completions and /v1/models: the request models
built per app (`generate_request_model`, `chat_request_model`) and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from softknn.generate.engine import GenParams
from softknn.generate.refusal import REFUSAL_TEXT
from softknn.params import Settings, param_field
from softknn.retrieval.filters import CheckedFilter
from softknn.service.schemas.common import (
    FILTER_DOC,
    KB_DOC,
    STRICT,
    Int,
    Out,
    Served,
    Text,
    integral,
    served,
)


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


def _stop(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


Stop = Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_stop),
                 Field(max_length=16, description="a string or up to 16 strings; the answer ends before the first")]


class GenerateFields(BaseModel):
    """Sampling, retrieval and memory fields shared by /v1/generate and /v1/chat/completions; bounds
    and defaults are set per app by generate_request_model / chat_request_model."""

    model_config = STRICT

    temperature: float
    top_p: float
    stop: Stop | None
    seed: int | None
    ignore_eos: bool
    stream: bool
    k: int | None
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None
    knn_temperature: float | None
    exact: bool
    mixing: Literal["joint", "fixed"]
    alpha: float
    prior: float | None
    positions: Literal["composite", "reordered"]
    use_kb: bool
    context: Literal["memory", "prompt"]
    evidence: int
    spans: int
    filter: CheckedFilter | None
    refuse: bool
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    def gen_params(self, max_tokens: int) -> GenParams:
        return GenParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                         stop=tuple(self.stop or ()), seed=self.seed, ignore_eos=self.ignore_eos, k=self.k, retrieval=self.retrieval,
                         lexical_weight=self.lexical_weight, knn_temperature=self.knn_temperature, exact=self.exact,
                         mixing=self.mixing, alpha=self.alpha, prior=self.prior, positions=self.positions, use_kb=self.use_kb,
                         context=self.context, evidence=self.evidence, spans=self.spans, filter=self.filter,
                         refuse=self.refuse)


def _gen_fields(settings: Settings) -> dict[str, Any]:
    """(annotation, FieldInfo) of every GenerateFields field with this app's bounds and GenParams' defaults."""
    lim, d = settings.limits, GenParams()
    return {
        "temperature": (float, Field(d.temperature, ge=0, le=100, description="sampling temperature; 0 = greedy "
                                     "(the default here, unlike OpenAI's 1)")),
        "top_p": (float, Field(d.top_p, gt=0, le=1, description="nucleus sampling: the smallest set of tokens "
                               "whose probability reaches top_p")),
        "stop": (Stop | None, Field(None)),
        "seed": (int | None, Field(d.seed, description="seed of the sampler (temperature > 0): the same seed, "
                                   "the same answer")),
        "ignore_eos": (bool, Field(d.ignore_eos, description="true: decode max_tokens tokens, past the model's end "
                                   "of answer (vLLM's and llama-server's ignore_eos; for benchmarks)")),
        "stream": (bool, Field(False, description="server-sent events, one per token, instead of one JSON answer")),
        "k": (Int | None, param_field("k", d.k, le=lim.max_k, description="KB chunks retrieved and placed in the "
                                "generator's attention; null = the bundle's own (chosen at build time from its "
                                "pseudo-questions: GET /v1/index generator.calibration), else 4")),
        "retrieval": (Literal["hybrid", "dense", "lexical"] | None, Field(
            d.retrieval, description="similarity of the k-NN, as /v1/infer's; null = the bundle's default")),
        "lexical_weight": (float | None, param_field("lexical_weight", d.lexical_weight,
                                                     description="λ of the hybrid similarity")),
        "knn_temperature": (float | None, param_field("knn_temperature", d.knn_temperature,
                                                      description="k-NN bandwidth τ of w_db (/v1/infer's `knn_temperature`)")),
        "exact": (bool, Field(d.exact, description="exact search, and the chunks' keys/values recomputed in float32 "
                              "after this prompt's own prefix (the masked-concatenation contract)")),
        "mixing": (Literal["joint", "fixed"], Field(d.mixing, description="joint: one softmax over the prompt's and "
                                                    "the KB's tokens; fixed: out = α·attn_own + (1−α)·attn_kb")),
        "alpha": (float, param_field("alpha", d.alpha, description="fixed mixing only: weight of the model's own context")),
        "prior": (float | None, Field(d.prior, ge=0, le=16, description="joint mixing only: β of the k-NN prior, "
                                      "each chunk's share of the one softmax times (k·w_db(c))^β; 0 = the plain joint "
                                      "softmax; null = the bundle's own (as k), else 4")),
        "positions": (Literal["composite", "reordered"], Field(d.positions, description="rotary placement of the "
                                                               "chunks: side by side (composite) or one after another")),
        "use_kb": (bool, Field(d.use_kb, description="false: the plain model, no retrieval")),
        "context": (Literal["memory", "prompt"], Field(d.context, description="memory: the KB in attention; prompt: "
                                                       "the same chunks' text in the prompt (the RAG baseline)")),
        "evidence": (Int, Field(min(d.evidence, lim.max_evidence), ge=0, le=lim.max_evidence,
                                description="evidence items returned")),
        "spans": (Int, param_field("spans", d.spans)),
        "filter": (CheckedFilter | None, Field(None, description=FILTER_DOC)),
        "refuse": (bool, Field(d.refuse, description="true: a question whose nearest KB chunk is less similar than the "
                               "bundle's refusal threshold (GET /v1/index generator.calibration.refusal) gets the refusal "
                               f"text {REFUSAL_TEXT!r} and grounded false, nothing decoded; false: answered anyway "
                               "(grounded still reported)")),
    }


def _with_fields(base: type[BaseModel], settings: Settings, name: str, doc: str, **more) -> type:
    from pydantic import create_model

    fields = {**_gen_fields(settings), **more}
    return create_model(name, __base__=base, __doc__=doc, **fields)


class GenerateRequestBase(GenerateFields):
    prompt: str | None
    raw: bool
    messages: list[ChatMessage] | None
    max_tokens: int

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


def generate_request_model(settings: Settings) -> type[GenerateRequestBase]:
    """The POST /v1/generate body with this app's limits baked in."""
    lim, g = settings.limits, settings.generator
    model = _with_fields(
        GenerateRequestBase, settings, "GenerateRequest",
        "Generation with the KB in the generator's attention: exactly one of `prompt` and `messages`.",
        prompt=(Text | None, Field(None, max_length=lim.max_chars, description="a question: one user turn through "
                                   "the generator's chat template, as `messages` with one user message would be "
                                   "(raw: text the model continues, tokenised as it is, the KB before it)")),
        raw=(bool, Field(False, description="true: `prompt` is raw text to continue (no chat template)")),
        messages=(list[ChatMessage] | None, Field(None, min_length=1, max_length=256, description="a chat, through "
                                                  "the generator's chat template; the KB at the head of the last "
                                                  "user message")),
        max_tokens=(Int, Field(min(64, g.max_tokens), ge=1, le=g.max_tokens, description="tokens generated at most")),
    )
    return model


class ChatRequestBase(GenerateFields):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str | None
    messages: list[ChatCompletionMessage]
    max_tokens: int | None
    max_completion_tokens: int | None
    n: int
    stream_options: StreamOptions | None
    user: str | None

    def limit(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


def chat_request_model(settings: Settings) -> type[ChatRequestBase]:
    """The POST /v1/chat/completions body: OpenAI's fields, and softknn's as extra top-level fields
    (what the openai client's `extra_body` sends)."""
    g = settings.generator
    # the bounds before the validator, so that the union's integer member carries minimum/maximum
    limited = Annotated[int, Field(ge=1, le=g.max_tokens), BeforeValidator(integral)]
    tokens = Field(None, description=f"tokens generated at most (default {min(64, g.max_tokens)})")
    return _with_fields(
        ChatRequestBase, settings, "ChatCompletionRequest",
        "OpenAI-compatible chat completion with the KB in the generator's attention.",
        model=(str | None, Field(None, description="the served generator's id (GET /v1/models); empty = it")),
        messages=(list[ChatCompletionMessage], Field(min_length=1, max_length=256)),
        max_tokens=(limited | None, tokens),
        max_completion_tokens=(limited | None, Field(None, description="as max_tokens (wins)")),
        n=(Int, Field(1, ge=1, le=1, description="choices per request: 1 only")),
        stream_options=(StreamOptions | None, Field(None, description="streaming: include_usage")),
        user=(str | None, Field(None, max_length=256, description="accepted, not used")),
    )


class Usage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class GenSpan(Out):
    text: str
    start: int = Field(description="char span [start, end) of the word in the chunk's document")
    end: int
    weight: float = Field(description="share of the chunk's memory mass on this word's tokens")


class GenEvidenceItem(Out):
    rank: int = Field(description="1 = most memory mass over the answer")
    chunk_id: str
    doc_id: str
    text: str
    start: int
    end: int
    label: str | None
    similarity: float = Field(description="s_c, what R was ranked and weighted by")
    dense_similarity: float
    bm25: float | None
    weight: float = Field(description="w_db(c) over the retrieved set")
    mass_share: float = Field(description="mean over generated tokens of the memory mass g_c on this chunk")
    spans: list[GenSpan] = Field(description="the chunk's words that drew the most mass")
    tokens: list[int] = Field(description="indexes into `tokens` of the generated tokens that drew on it most")


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
    mixing: Literal["joint", "fixed"] | None = Field(description="null: no memory (use_kb false, prompt context)")
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
    runtime: str | None = Field(None, description="what decoded: `graph q4` (the decode graph and its weights) or "
                                "`torch` (the memory hook: fixed α, exact)")
    w_db_entropy: float
    w_db_effective_k: float
    attention_effective_k: float
    exact: bool
    filtered: int | None = Field(description="chunks that pass the request's filter (null: no filter or no retrieval)")
    grounding: GroundingDiagnostics | None = Field(None, description="the refusal verdict and why")


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
    return {**served(request_id, ge.engine), **answer.to_dict()}
