"""POST /v1/infer: the request model (`InferRequest`, its parameters the table's: softknn.common.table.InferParams)
and the response, which documents every field of the engine's result object (softknn/infer/results.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, PrivateAttr, model_validator

from softknn.common.errors import InputTooLarge
from softknn.common.table import InferParams, Mixing, Retrieval
from softknn.service.schemas.common import (
    KB_DOC,
    SOURCES_DOC,
    STRICT,
    ChunkRef,
    Out,
    Served,
    Text,
)
from softknn.service.schemas.table import app_settings, derived, request_fields


def count_inputs(v: Any) -> Any:
    """Before item validation: a 10⁶-item list is refused without walking it."""
    limit = app_settings().limits.max_inputs
    if isinstance(v, list) and len(v) > limit:
        raise InputTooLarge(f"{len(v)} inputs, more than the limit {limit}", field="inputs")
    return v


def cut_texts(texts: list[str], truncate: bool | None, field: str, hint: str) -> list[int]:
    """Cut each text over the server's limits.max_chars in place (truncate), else InputTooLarge naming
    it (`field` formatted with its index i); the indexes cut."""
    limit, cut = app_settings().limits.max_chars, []
    for i, t in enumerate(texts):
        if len(t) > limit:
            if not truncate:
                where = field.format(i=i)
                raise InputTooLarge(f"{where} has {len(t)} characters, more than the limit {limit}; {hint}", field=where)
            texts[i] = t[:limit]
            cut.append(i)
    return cut


class InferBody(BaseModel):
    """The fields of /v1/infer that are not InferParams': the texts and the KB."""

    model_config = STRICT

    inputs: Annotated[list[Text], BeforeValidator(count_inputs)] = Field(
        min_length=1, description="1..limits.max_inputs (64 by default) non-empty texts, each ≤ limits.max_chars "
        "(20000 by default) characters (longer ones need `truncate`) and ≤ the model's token limit (or `truncate`)")
    kb: str | None = Field(None, min_length=1, max_length=256, description=KB_DOC)
    _cut: list[int] = PrivateAttr(default_factory=list)  # inputs cut to max_chars (truncate)

    @model_validator(mode="after")
    def _chars(self) -> InferBody:
        self._cut = cut_texts(self.inputs, getattr(self, "truncate", None), "inputs[{i}]", "send truncate=true to cut it")
        return self

    @property
    def cut(self) -> list[int]:
        """Indices of the inputs this model cut to the character limit."""
        return list(self._cut)


InferRequest = derived("InferRequest", InferBody, "Knowledge-augmented inference over one or more texts; every "
                       "field but `inputs` is optional, and one left unset (null) takes the server's setting "
                       "(SOFTKNN_DEFAULTS__*), else the bundle's own, else the default it names.",
                       request_fields(InferParams))


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
    weight: float = Field(description="memory mass on this word's tokens, mean over heads and query positions "
                          "(generation: over the answer's tokens)")
    share: float = Field(description="weight / the chunk's mass_share")
    query_tokens: list[QueryToken] = Field(description="the input tokens that pulled this span most (≤ 3; "
                                           "generation: none)")


class Ranked(Out):
    rank: int = Field(description="0 = largest memory-mass share")


class Evidence(ChunkRef, Ranked):  # rank first, then the chunk's fields: the order of softknn.infer.results.EvidenceItem
    """One retrieved chunk and why: softknn.infer.results.EvidenceItem, the one evidence type of an inference
    (EvidenceItem) and of a generated answer (GenEvidenceItem, whose influence is null and tokens set)."""

    similarity: float = Field(description="k-NN score s_c the chunk was ranked and weighted by (dense: e_q·e_c; "
                              "hybrid: (1−λ)·dense + λ·BM25, normalised; lexical: BM25, normalised)")
    dense_similarity: float = Field(description="e_q·e_c, the dense similarity")
    bm25: float | None = Field(description="BM25 score of the chunk for the input (null: dense retrieval)")
    matched_terms: list[str] | None = Field(description="the input's words found in the chunk by the lexical "
                                            "index (after stemming; null: dense retrieval)")
    weight: float = Field(description="Nadaraya–Watson weight w_db(c) over the retrieved set R")
    mass_share: float = Field(description="share of the layer's attention mass on this chunk (fixed: (1−α)·w_db); "
                              "generation: its mean over the generated tokens")


class EvidenceItem(Evidence):
    influence: float = Field(description="‖Δout‖/‖out‖ of the memory layer if this chunk were removed and the "
                             "weights renormalised (closed form)")
    spans: list[Span]
    query_tokens: list[QueryToken] = Field(description="the input tokens that pulled this chunk most (≤ 5)")
    tokens: list[int] | None = Field(None, description="null for an inference (a generated answer's: the indexes of "
                                     "its query_tokens in the answer's `tokens`)")


class Diagnostics(Out):
    memory_share: float = Field(description="mean over heads and query tokens of the memory's gate mass")
    retrieved: int = Field(description="|R|, chunks the fused layer attended")
    k: int
    alpha: float | None = Field(description="α used (null for joint mixing)")
    mixing: Mixing
    knn_temperature: float = Field(description="τ used (the request's, else the bundle's or the retrieval's default)")
    temperature: float = Field(description="deprecated: use knn_temperature (the same τ, echoed under its old name)",
                               deprecated=True)
    kernel: str
    threshold: float | None
    retrieval: Retrieval = Field(description="the similarity R was ranked by")
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
    sources: dict[str, str] = Field(default_factory=dict, description=SOURCES_DOC)


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
