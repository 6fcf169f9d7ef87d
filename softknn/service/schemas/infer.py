"""POST /v1/infer: the request model built per app (`infer_request_model`) and the response, which
documents every field of the engine's result object (softknn/infer/results.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

from softknn.common.errors import InputTooLarge
from softknn.infer.engine import InferParams
from softknn.params import Settings, alias_field, merge_alias, param_field
from softknn.retrieval.filters import CheckedFilter
from softknn.service.schemas.common import (
    FILTER_DOC,
    KB_DOC,
    STRICT,
    Int,
    Out,
    Served,
    Text,
)


class InferRequestBase(BaseModel):
    """Fields shared by every app's InferRequest; bounds and defaults are set by infer_request_model."""

    model_config = STRICT

    inputs: list[Text]
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
    evidence: int
    spans: int
    return_tokens: bool
    truncate: bool
    filter: CheckedFilter | None
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)
    _cut: list[int] = PrivateAttr(default_factory=list)  # inputs cut to max_chars (truncate)

    @model_validator(mode="after")
    def _tau_alias(self):
        merge_alias(self, "knn_temperature", "temperature")
        return self

    @property
    def cut(self) -> list[int]:
        """Indices of the inputs this model cut to the character limit."""
        return list(self._cut)

    def to_params(self, hybrid_pool: int, candidates: int) -> list[InferParams]:
        """One InferParams per input (a request's inputs share its parameters)."""
        p = InferParams(alpha=self.alpha, mixing=self.mixing, k=self.k, temperature=self.knn_temperature,
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
        alpha: float = param_field("alpha", d.alpha)
        mixing: Literal["fixed", "joint"] = param_field("mixing", d.mixing)
        k: Int = param_field("k", d.k, le=lim.max_k)
        knn_temperature: float | None = param_field("knn_temperature", d.knn_temperature)
        temperature: float | None = alias_field("knn_temperature", "temperature")
        kernel: Literal["softmax", "epanechnikov", "uniform"] = param_field("kernel", d.kernel)
        exact: bool = param_field("exact")
        threshold: float | None = param_field("threshold", description="top-k + threshold: also keep chunks of "
                                              f"the {d.hybrid_pool}-candidate pool whose weight is ≥ threshold")
        retrieval: Literal["hybrid", "dense", "lexical"] | None = param_field("retrieval", d.retrieval)
        lexical_weight: float | None = param_field("lexical_weight", d.lexical_weight)
        evidence: Int = param_field("evidence", min(d.evidence, lim.max_evidence), le=lim.max_evidence)
        spans: Int = param_field("spans", d.spans)
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


# --- responses -------------------------------------------------------------------------------
class QueryToken(Out):
    index: int = Field(description="position of the token in the input's tokenization")
    text: str = Field(description="the token's text in the input ('[special]' for [CLS]/[SEP])")
    start: int = Field(description="char span [start, end) in the input")
    end: int
    weight: float = Field(description="mean over heads of g_c·p_c mass this query token put on the chunk/span")


class Span(Out):
    start: int = Field(description="char span [start, end) of the word in the chunk's document")
    end: int
    text: str
    weight: float = Field(description="memory mass on this word's tokens, mean over heads and query positions")
    share: float = Field(description="weight / the chunk's mass_share")
    query_tokens: list[QueryToken] = Field(description="the input tokens that pulled this span most (≤ 3)")


class EvidenceItem(Out):
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


class Diagnostics(Out):
    memory_share: float = Field(description="mean over heads and query tokens of the memory's gate mass")
    retrieved: int = Field(description="|R|, chunks the fused layer attended")
    k: int
    alpha: float | None = Field(description="α used (null for joint mixing)")
    mixing: Literal["fixed", "joint"]
    knn_temperature: float = Field(description="τ used (the request's, else the bundle's or the retrieval's default)")
    temperature: float = Field(description="deprecated: use knn_temperature (the same τ, echoed under its old name)",
                               deprecated=True)
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


class Token(Out):
    index: int
    text: str
    start: int
    end: int
    special: bool
    memory_share: float = Field(description="memory gate mass at this token, mean over heads")


class Neighbour(Out):
    chunk_id: str
    label: str | None
    similarity: float = Field(description="e·e_c, the embedding's dot product with the chunk's (exact search)")


class VersusPlain(Out):
    cosine: float = Field(description="cos(e, e') of the plain model's embedding e and the knowledge-augmented e'")
    l2: float = Field(description="‖e' − e‖")
    nearest_plain: list[Neighbour] = Field(description="the KB chunks nearest e (the plain model's embedding)")
    nearest_augmented: list[Neighbour] = Field(description="the KB chunks nearest e' (the knowledge-augmented one)")


class InferResult(Out):
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


class InferResponse(Served):
    results: list[InferResult] = Field(description="one result per input, in order")
