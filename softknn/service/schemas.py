"""Request and response models of the HTTP contract (v1, DESIGN.md "The HTTP contract").

Requests are strict: unknown fields, wrong JSON types, NaN/±inf and out-of-range numbers are
refused here, so the inference worker never sees a bad request. The bounds come from
`settings.limits` and the defaults from `settings.defaults`, so the request model is built per
app by `infer_request_model(settings)` (its OpenAPI schema shows the real bounds and defaults).
Size limits (too many inputs, a text over `max_chars` without `truncate`) raise the core's
`InputTooLarge`, which the one error map answers with 413.

Responses document every field of the engine's result object (softknn/infer/results.py) with
`extra="forbid"`, so a field the core adds without documenting it fails the contract tests.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from softknn.common.errors import InputTooLarge, InvalidInput
from softknn.generate.engine import GenParams
from softknn.infer.engine import InferParams
from softknn.params import Settings
from softknn.retrieval.filters import MAX_DEPTH, MAX_NODES, MAX_VALUES, CheckedFilter

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
# τ outside [1e-6, 1e6] is refused as a mistake, not a setting: scores s lie in [−1, 1], so below it
# w_db is already one-hot and above it already uniform.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
MAX_SPANS = 256  # a chunk has at most max_seq_length tokens, so at most that many word spans
FILTER_DOC = ("R is drawn from the chunks that pass this filter only: {field, eq|in|gt|gte|lt|lte} on doc_id, "
              "chunk_id, label or metadata.NAME, combined with {and: [...]}, {or: [...]}, {not: ...}; "
              f"≤ {MAX_DEPTH} levels, ≤ {MAX_NODES} objects, ≤ {MAX_VALUES} `in` values; null = every chunk")


def _check_text(s: str) -> str:
    if not s.strip():
        raise PydanticCustomError("empty_text", "text must contain at least one non-whitespace character")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_text", "text is not valid Unicode (lone surrogate escape)") from None
    return s


# The pattern documents _check_text's rule in the OpenAPI schema: \S, at least one non-whitespace
# character (JSON Schema patterns search, unanchored). Validation stays in _check_text, with its message.
# Found by tests/reliability/test_fuzz.py: a blank text was schema-valid but refused.
Text = Annotated[str, AfterValidator(_check_text), Field(json_schema_extra={"pattern": r"\S"})]


def _integral(v: Any) -> Any:
    """4.0 → 4: JSON Schema's "integer" is any number with a zero fractional part (2020-12 core §4.2.1), and
    JSON writers such as Python's emit 4.0 for a float that holds 4. 4.5, NaN, ±inf stay floats and
    are refused by strict int validation. Found by tests/reliability/test_fuzz.py ({"evidence": 1.0})."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


Int = Annotated[int, BeforeValidator(_integral)]
KB_DOC = ("the KB to use, by name; empty = the only KB this key may use, else the one named `default` "
          "(a name this key may not use answers 404 as one that does not exist)")


class InferRequestBase(BaseModel):
    """Fields shared by every app's InferRequest; bounds and defaults are set by infer_request_model."""

    model_config = STRICT

    inputs: list[Text]
    alpha: float
    mixing: Literal["fixed", "joint"]
    k: int
    temperature: float | None
    kernel: Literal["softmax", "epanechnikov", "uniform"]
    exact: bool
    threshold: float | None
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None
    evidence: int
    spans: int
    return_tokens: bool
    truncate: bool
    filter: CheckedFilter | None
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)
    _cut: list[int] = PrivateAttr(default_factory=list)  # inputs cut to max_chars (truncate)

    @property
    def cut(self) -> list[int]:
        """Indices of the inputs this model cut to the character limit."""
        return list(self._cut)

    def to_params(self, hybrid_pool: int, candidates: int) -> list[InferParams]:
        """One InferParams per input (a request's inputs share its parameters)."""
        p = InferParams(alpha=self.alpha, mixing=self.mixing, k=self.k, temperature=self.temperature,
                        kernel=self.kernel, exact=self.exact, threshold=self.threshold, hybrid_pool=hybrid_pool,
                        evidence=self.evidence, spans=self.spans, return_tokens=self.return_tokens,
                        truncate=self.truncate, retrieval=self.retrieval, lexical_weight=self.lexical_weight,
                        candidates=candidates, filter=self.filter)
        return [p] * len(self.inputs)


def infer_request_model(settings: Settings) -> type[InferRequestBase]:
    """The POST /v1/infer body model with this app's limits and defaults baked in."""
    d, lim = settings.defaults, settings.limits

    def count(v: Any) -> Any:  # before item validation: a 10⁶-item list is refused without walking it
        if isinstance(v, list) and len(v) > lim.max_inputs:
            raise InputTooLarge(f"{len(v)} inputs, more than the limit {lim.max_inputs}", field="inputs")
        return v

    class InferRequest(InferRequestBase):
        """Knowledge-augmented inference over one or more texts; every field but `inputs` is optional."""

        model_config = ConfigDict(title="InferRequest")

        inputs: Annotated[list[Text], BeforeValidator(count)] = Field(
            min_length=1, json_schema_extra={"maxItems": lim.max_inputs},
            description=f"1..{lim.max_inputs} non-empty texts, each ≤ {lim.max_chars} characters "
                        "(longer ones need `truncate`) and ≤ the model's token limit (or `truncate`)")
        alpha: float = Field(d.alpha, ge=0, le=1, description="fixed mixing: weight of the input's own attention, "
                             "out = α·attn_intra + (1−α)·attn_db (seed 000 §4.3); ignored by joint mixing")
        mixing: Literal["fixed", "joint"] = Field(d.mixing, description="fixed: the α rule; joint: one softmax "
                                                  "over input and retrieved tokens (memory share is reported)")
        k: Int = Field(d.k, ge=1, le=lim.max_k, description="KB chunks retrieved by the external k-NN")
        temperature: float | None = Field(d.temperature, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE,
                                          description="k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel; "
                                          "null = the retrieval's default")
        kernel: Literal["softmax", "epanechnikov", "uniform"] = Field(d.kernel, description="k-NN kernel (seed 001)")
        exact: bool = Field(False, description="exact (brute-force) search instead of the ANN index; with hybrid "
                            "or lexical retrieval, the similarity computed over every chunk")
        threshold: float | None = Field(None, gt=0, lt=1, description="top-k + threshold: also keep chunks of the "
                                        f"{d.hybrid_pool}-candidate pool whose weight is ≥ threshold")
        retrieval: Literal["hybrid", "dense", "lexical"] | None = Field(
            d.retrieval, description="similarity s_c of the external k-NN: dense e_q·e_c, lexical BM25, or hybrid "
            "(1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid where the bundle "
            "has a lexical index, else dense")
        lexical_weight: float | None = Field(d.lexical_weight, ge=0, le=1, description="λ of the hybrid similarity; "
                                             "null = the λ the bundle's build chose (labelled or not) or the default")
        evidence: Int = Field(min(d.evidence, lim.max_evidence), ge=0, le=lim.max_evidence,
                              description="evidence items returned per input")
        spans: Int = Field(d.spans, ge=0, le=MAX_SPANS, description="highlighted word spans per evidence item")
        return_tokens: bool = Field(False, description="also return per-token outputs: tokens, token_embeddings, "
                                    "head_memory_share, and versus_plain (the change against the plain model)")
        truncate: bool = Field(False, description="cut inputs over the character or token limit instead of "
                               "refusing them (413)")
        filter: CheckedFilter | None = Field(None, description=FILTER_DOC)

        @model_validator(mode="after")
        def _chars(self) -> InferRequest:
            for i, t in enumerate(self.inputs):
                if len(t) > lim.max_chars:
                    if not self.truncate:
                        raise InputTooLarge(f"inputs[{i}] has {len(t)} characters, more than the limit "
                                            f"{lim.max_chars}; send truncate=true to cut it", field=f"inputs[{i}]")
                    self.inputs[i] = t[: lim.max_chars]
                    self._cut.append(i)
            return self

    return InferRequest


class ReloadRequest(BaseModel):
    model_config = STRICT

    bundle: str = Field(min_length=1, max_length=4096, description="bundle directory, as the server sees "
                        "it, or a URI in object storage (s3://bucket/kb), fetched to the server's cache")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)


# --- responses -------------------------------------------------------------------------------
class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryToken(_Out):
    index: int = Field(description="position of the token in the input's tokenization")
    text: str = Field(description="the token's text in the input ('[special]' for [CLS]/[SEP])")
    start: int = Field(description="char span [start, end) in the input")
    end: int
    weight: float = Field(description="mean over heads of g_c·p_c mass this query token put on the chunk/span")


class Span(_Out):
    start: int = Field(description="char span [start, end) of the word in the chunk's document")
    end: int
    text: str
    weight: float = Field(description="memory mass on this word's tokens, mean over heads and query positions")
    share: float = Field(description="weight / the chunk's mass_share")
    query_tokens: list[QueryToken] = Field(description="the input tokens that pulled this span most (≤ 3)")


class EvidenceItem(_Out):
    rank: int = Field(description="0 = largest memory-mass share")
    chunk_id: str
    doc_id: str
    text: str = Field(description="the chunk's text")
    start: int = Field(description="char span [start, end) of the chunk in its document")
    end: int
    label: str | None
    metadata: dict[str, Any]
    similarity: float = Field(description="k-NN score s_c the chunk was ranked and weighted by (dense: e_q·e_c; "
                              "hybrid: (1−λ)·dense + λ·BM25, normalised; lexical: BM25, normalised)")
    dense_similarity: float = Field(description="e_q·e_c, the dense similarity")
    bm25: float | None = Field(description="BM25 score of the chunk for the input (null: dense retrieval)")
    matched_terms: list[str] | None = Field(description="the input's words found in the chunk by the lexical "
                                            "index (after stemming; null: dense retrieval)")
    weight: float = Field(description="Nadaraya–Watson weight w_db(c) over the retrieved set R")
    mass_share: float = Field(description="share of the layer's attention mass on this chunk (fixed: (1−α)·w_db)")
    influence: float = Field(description="‖Δout‖/‖out‖ of the memory layer if this chunk were removed and the "
                             "weights renormalised (closed form)")
    spans: list[Span]
    query_tokens: list[QueryToken] = Field(description="the input tokens that pulled this chunk most (≤ 5)")


class Diagnostics(_Out):
    memory_share: float = Field(description="mean over heads and query tokens of the memory's gate mass")
    retrieved: int = Field(description="|R|, chunks the fused layer attended")
    k: int
    alpha: float | None = Field(description="α used (null for joint mixing)")
    mixing: Literal["fixed", "joint"]
    temperature: float
    kernel: str
    threshold: float | None
    retrieval: Literal["hybrid", "dense", "lexical"] = Field(description="the similarity R was ranked by")
    lexical_weight: float | None = Field(description="λ used (hybrid only)")
    candidates: int | None = Field(description="hybrid/lexical: each retriever's top m considered")
    nearest_similarity: float = Field(description="largest e_q·e_c over the KB (the abstain rule's s_1)")
    search: str = Field(description="'exact' or the ANN index kind that answered")
    memory_layer: int
    w_db_entropy: float = Field(description="entropy H of w_db (nats)")
    w_db_effective_k: float = Field(description="exp(H(w_db))")
    attention_entropy: float = Field(description="entropy of the fused attention distribution, mean over heads/tokens")
    attention_effective_k: float
    attention_entropy_intra: float = Field(description="entropy of the input's own attention alone")
    truncation_bound: float = Field(description="upper bound on the kernel mass lost to top-k truncation")
    n_tokens: int
    truncated: bool = Field(description="true when the input was cut to the token or character limit")
    filtered: int | None = Field(description="chunks that pass the request's filter, the KB R was drawn from "
                                 "(null: no filter)")


class Token(_Out):
    index: int
    text: str
    start: int
    end: int
    special: bool
    memory_share: float = Field(description="memory gate mass at this token, mean over heads")


class Neighbour(_Out):
    chunk_id: str
    label: str | None
    similarity: float = Field(description="e·e_c, the embedding's dot product with the chunk's (exact search)")


class VersusPlain(_Out):
    cosine: float = Field(description="cos(e, e') of the plain model's embedding e and the knowledge-augmented e'")
    l2: float = Field(description="‖e' − e‖")
    nearest_plain: list[Neighbour] = Field(description="the KB chunks nearest e (the plain model's embedding)")
    nearest_augmented: list[Neighbour] = Field(description="the KB chunks nearest e' (the knowledge-augmented one)")


class InferResult(_Out):
    embedding: list[float] = Field(description="knowledge-augmented sentence embedding (pooled, normalised)")
    evidence: list[EvidenceItem]
    diagnostics: Diagnostics
    label_scores: dict[str, float] | None = Field(description="Σ_c w_db(c)·onehot(label_c), high to low; null "
                                                  "when the KB has no labels")
    prediction: str | None = Field(description="top label, or null (unlabelled KB, or abstained)")
    abstained: bool
    abstain_reason: str | None = Field(None, description="why no prediction was made")
    tokens: list[Token] | None = Field(None, description="with return_tokens: the input's tokens")
    token_embeddings: list[list[float]] | None = Field(None, description="with return_tokens: (n_tokens, dim)")
    head_memory_share: list[list[float]] | None = Field(None, description="with return_tokens: (heads, n_tokens)")
    versus_plain: VersusPlain | None = Field(None, description="with return_tokens: what the KB changed against the "
                                             "plain model's own output (label scores come from w_db and do not)")


class Served(_Out):
    request_id: str
    model: str = Field(description="serving model name")
    model_fingerprint: str = Field(description="sha256 over the model's weights")
    bundle_version: str = Field(description="version_id of the bundle that answered")


class InferResponse(Served):
    results: list[InferResult] = Field(description="one result per input, in order")


class BundleSummary(_Out):
    version_id: str
    path: str
    created_at: str | None
    model: dict[str, Any]
    memory_layer: int
    index: dict[str, Any]
    kv_dtype: str
    memory: dict[str, Any] = Field(description="the memory representation (kv, hidden, hidden-fp16, hidden-int8, "
                                               "recompute): kind, files, bytes, bytes_per_chunk")
    counts: dict[str, int]
    labels: list[str]
    calibration: dict[str, Any]
    lexical: dict[str, Any] = Field(description="the BM25 index: available, default_retrieval, settings, bytes")
    bytes: int


class KBInfo(_Out):
    name: str = Field(description="the KB's name: send it as `kb` (a body field on POST routes, a query parameter elsewhere)")
    status: str = Field(description="starting | ready | no_bundle | failed")
    bundle_version: str | None = Field(description="version_id of the bundle it serves; null until it is ready")
    chunks: int | None = Field(description="chunks in that bundle; null until it is ready")
    error: str | None = Field(description="why it is not ready (no_bundle, failed); else null")


class KbsResponse(_Out):
    request_id: str
    kbs: list[KBInfo] = Field(description="the KBs this caller's credential may see, in the order served")
    default: str | None = Field(description="the KB a request that names none gets; null when the caller sees "
                                "several and none is named `default` (then every request must name one)")
    write: bool = Field(description="whether this credential may write (PUT/DELETE /v1/documents) to these KBs")


class ModelRuntime(_Out):
    name: str = Field(description="what runs the plain forward: torch | onnx")
    precision: str = Field(description="its numerics: fp32 | int8 (SOFTKNN_MODEL__PRECISION)")
    verified_max_abs_diff: float | None = Field(description="onnx: max |onnx − torch| over the verification "
                                                "inputs, checked at start; null for torch")
    requested: str = Field(description="what SOFTKNN_MODEL__RUNTIME asked for: auto | torch | onnx")
    fallback: str | None = Field(description="auto running torch: why onnx did not open here (not the CPU, "
                                 "onnxruntime missing, an export that failed its checks); else null")


class IndexResponse(Served):
    index: BundleSummary
    runtime: ModelRuntime = Field(description="the serving model runtime")


def runtime_payload(encoder) -> dict:
    onnx = getattr(encoder, "onnx", None)
    info = encoder.info
    return {"name": info.runtime, "precision": info.precision,
            "verified_max_abs_diff": onnx.verification["max_abs_diff"] if onnx is not None else None,
            "requested": getattr(info, "requested", info.runtime), "fallback": getattr(info, "fallback", None)}


class Entry(_Out):
    row: int = Field(description="row of the chunk in the bundle")
    chunk_id: str
    doc_id: str
    text: str
    start: int
    end: int
    label: str | None
    metadata: dict[str, Any]
    token_spans: list[tuple[int, int]] = Field(description="char span in the document of each memory token")


class EntryResponse(Served):
    entry: Entry


class ReloadResponse(Served):
    previous_version: str | None
    index: BundleSummary


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


def entry_payload(bundle, row: int) -> dict:
    c = bundle.chunks[row]
    st, n = int(bundle.kv.start[row]), int(bundle.kv.count[row])
    return {"row": row, "chunk_id": c["chunk_id"], "doc_id": c["doc_id"], "text": c["text"], "start": c["start"],
            "end": c["end"], "label": c.get("label"), "metadata": c.get("metadata") or {},
            "token_spans": [tuple(s) for s in bundle.token_spans[st : st + n].tolist()]}


# --- generation (/v1/generate, /v1/chat/completions) ------------------------------------------
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
    stream: bool
    k: int
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None
    knn_temperature: float | None
    exact: bool
    mixing: Literal["joint", "fixed"]
    alpha: float
    prior: float
    positions: Literal["composite", "reordered"]
    use_kb: bool
    context: Literal["memory", "prompt"]
    evidence: int
    spans: int
    filter: CheckedFilter | None
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)

    def gen_params(self, max_tokens: int) -> GenParams:
        return GenParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                         stop=tuple(self.stop or ()), seed=self.seed, k=self.k, retrieval=self.retrieval,
                         lexical_weight=self.lexical_weight, knn_temperature=self.knn_temperature, exact=self.exact,
                         mixing=self.mixing, alpha=self.alpha, prior=self.prior, positions=self.positions, use_kb=self.use_kb,
                         context=self.context, evidence=self.evidence, spans=self.spans, filter=self.filter)


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
        "stream": (bool, Field(False, description="server-sent events, one per token, instead of one JSON answer")),
        "k": (Int, Field(d.k, ge=1, le=lim.max_k, description="KB chunks retrieved and placed in the generator's "
                         "attention")),
        "retrieval": (Literal["hybrid", "dense", "lexical"] | None, Field(
            d.retrieval, description="similarity of the k-NN, as /v1/infer's; null = the bundle's default")),
        "lexical_weight": (float | None, Field(d.lexical_weight, ge=0, le=1, description="λ of the hybrid similarity")),
        "knn_temperature": (float | None, Field(d.knn_temperature, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE,
                                                description="k-NN bandwidth τ of w_db (/v1/infer's `temperature`)")),
        "exact": (bool, Field(d.exact, description="exact search, and the chunks' keys/values recomputed in float32 "
                              "after this prompt's own prefix (the masked-concatenation contract)")),
        "mixing": (Literal["joint", "fixed"], Field(d.mixing, description="joint: one softmax over the prompt's and "
                                                    "the KB's tokens; fixed: out = α·attn_own + (1−α)·attn_kb")),
        "alpha": (float, Field(d.alpha, ge=0, le=1, description="fixed mixing only: weight of the model's own context")),
        "prior": (float, Field(d.prior, ge=0, le=16, description="joint mixing only: β of the k-NN prior, each "
                               "chunk's share of the one softmax times (k·w_db(c))^β; 0 = the plain joint softmax")),
        "positions": (Literal["composite", "reordered"], Field(d.positions, description="rotary placement of the "
                                                               "chunks: side by side (composite) or one after another")),
        "use_kb": (bool, Field(d.use_kb, description="false: the plain model, no retrieval")),
        "context": (Literal["memory", "prompt"], Field(d.context, description="memory: the KB in attention; prompt: "
                                                       "the same chunks' text in the prompt (the RAG baseline)")),
        "evidence": (Int, Field(min(d.evidence, lim.max_evidence), ge=0, le=lim.max_evidence,
                                description="evidence items returned")),
        "spans": (Int, Field(d.spans, ge=0, le=MAX_SPANS, description="highlighted word spans per evidence item")),
        "filter": (CheckedFilter | None, Field(None, description=FILTER_DOC)),
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
    limited = Annotated[int, Field(ge=1, le=g.max_tokens), BeforeValidator(_integral)]
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


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class GenSpan(_Out):
    text: str
    start: int = Field(description="char span [start, end) of the word in the chunk's document")
    end: int
    weight: float = Field(description="share of the chunk's memory mass on this word's tokens")


class GenEvidenceItem(_Out):
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


class GenTokenItem(_Out):
    index: int
    text: str = Field(description="the text this token added")
    memory_share: float = Field(description="Σ_c g_c for the step that produced it (0 without memory)")
    top_chunk: str | None = Field(description="the chunk it drew on most")


class GenDiagnostics(_Out):
    memory_share: float = Field(description="mean over generated tokens of the memory's attention mass")
    retrieved: int
    k: int
    mixing: Literal["joint", "fixed"] | None = Field(description="null: no memory (use_kb false, prompt context)")
    alpha: float | None
    positions: str
    retrieval: str | bool | None = Field(description="the similarity R was ranked by (null: no retrieval)")
    memory_layers: int
    memory_tokens: int
    memory_source: str = Field(description="stored fp32/fp16/int8, recomputed, prompt or none")
    w_db_entropy: float
    w_db_effective_k: float
    attention_effective_k: float
    exact: bool
    filtered: int | None = Field(description="chunks that pass the request's filter (null: no filter or no retrieval)")


class GenerateResponse(Served):
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: Usage
    evidence: list[GenEvidenceItem]
    diagnostics: GenDiagnostics
    tokens: list[GenTokenItem]
    generator: str = Field(description="the generator's name")


class ChatChoiceMessage(_Out):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Out):
    index: int
    message: ChatChoiceMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class SoftknnExtra(_Out):
    request_id: str
    bundle_version: str
    evidence: list[GenEvidenceItem]
    diagnostics: GenDiagnostics
    tokens: list[GenTokenItem]


class ChatCompletion(_Out):
    id: str = Field(description="chatcmpl-<request id>")
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = Field(description="the bundle version")
    choices: list[ChatChoice]
    usage: Usage
    softknn: SoftknnExtra = Field(description="evidence and diagnostics of the answer")


class ModelCard(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]


def generation_payload(request_id: str, ge, answer) -> dict:
    return {**served(request_id, ge.engine), **answer.to_dict()}


# --- OpenAI-compatible embeddings (/v1/embeddings) and TEI-compatible rerank (/v1/rerank) ----------
AUGMENT_FIELDS = ("alpha", "mixing", "k", "temperature", "kernel", "exact", "threshold", "retrieval", "lexical_weight")


class EmbeddingOptionsBase(BaseModel):
    """softknn's extension of an embeddings request (the `softknn` field); bounds set per app."""

    model_config = STRICT

    augmented: bool
    truncate: bool
    alpha: float
    mixing: Literal["fixed", "joint"]
    k: int
    temperature: float | None
    kernel: Literal["softmax", "epanechnikov", "uniform"]
    exact: bool
    threshold: float | None
    retrieval: Literal["hybrid", "dense", "lexical"] | None
    lexical_weight: float | None

    def to_params(self, hybrid_pool: int, candidates: int) -> InferParams:
        """The /v1/infer parameters of the augmented embedding (no evidence: only the embedding is returned)."""
        return InferParams(alpha=self.alpha, mixing=self.mixing, k=self.k, temperature=self.temperature,
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
                    _check_text(t)
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


class EmbeddingData(_Out):
    object: Literal["embedding"]
    index: int = Field(description="position of the text in `input`")
    embedding: list[float] | str = Field(description="the pooled, normalised sentence embedding: numbers, or "
                                         "(encoding_format base64) its little-endian float32 bytes in base64")


class EmbeddingUsage(_Out):
    prompt_tokens: int = Field(description="tokens the model ran on, special tokens included, after any cut "
                               "(the encoder's tokenizer)")
    total_tokens: int


class EmbeddingExtra(_Out):
    request_id: str
    augmented: bool = Field(description="true: knowledge-augmented embeddings (the fused memory layer)")
    bundle_version: str | None = Field(description="the bundle the augmented embeddings drew on (null: plain)")


class EmbeddingResponse(_Out):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    softknn: EmbeddingExtra


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
        top_n: Annotated[int, Field(ge=1), BeforeValidator(_integral)] | None = Field(
            None, description="return the n best only (all: null)")
        retrieval: Literal["hybrid", "dense", "lexical"] | None = Field(
            settings.defaults.retrieval, description="the similarity: hybrid, dense or lexical, as /v1/infer's; "
            "null = hybrid where the bundle has a lexical index, else dense")
        lexical_weight: float | None = Field(settings.defaults.lexical_weight, ge=0, le=1, description="λ of the "
                                             "hybrid similarity; null = the λ the bundle's build chose or the default")
        exact: bool = Field(False, description="the dense range over every chunk instead of the ANN index's top m")

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


class Rank(_Out):
    index: int = Field(description="position of the text in `texts`")
    score: float = Field(description="s_t, the retrieval's similarity for this text (docs/design.md, \"Rerank\")")
    text: str | None = Field(None, description="the text, with return_text")
# --- KB writes (PUT/DELETE/GET /v1/documents/{doc_id}) --------------------------------------------
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


class DocumentChunk(_Out):
    chunk_id: str
    start: int = Field(description="first char of the chunk in the document")
    end: int
    text: str


class DocumentOut(_Out):
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
