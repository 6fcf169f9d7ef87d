"""What `Engine.infer` returns: one `InferResult` per input, typed and immutable; and the one evidence
type, `EvidenceItem` with its `Span`s, that a generated answer carries too (softknn.generate.engine).

The same object `softknn query --json` prints and `POST /v1/infer` returns; softknn/service/schemas/infer.py
documents every field for the OpenAPI schema (tests/service/test_contract.py checks the two agree
field for field). orjson renders these dataclasses natively (`orjson.dumps(result)`), close to
as fast as the dicts they replace (bench/json_encode.py). Nothing changes a result once built: the service
derives a new one (`InferResult.truncated`) where it knows more than the engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

# frozen, not slotted: orjson reads a dataclass's __dict__ directly; with slots=True it goes field
# by field and renders a whole answer several times slower (bench/json_encode.py; docs/benchmarks.md)
_FROZEN = {"frozen": True}


@dataclass(**_FROZEN)
class QueryToken:
    """A token of the input (inference) or of the answer (generation) that drew on a chunk or span."""

    index: int  # position in the input's tokenization; generation: in the answer's tokens
    text: str  # the token's text in the input ('[special]' for [CLS]/[SEP]); generation: the text it added
    start: int  # char span [start, end) in the input; generation: in the answer's text
    end: int
    weight: float  # mean over heads of g_c·p_c mass this query token put on the chunk or span


@dataclass(**_FROZEN)
class Span:
    """A word of a retrieved chunk, with the memory mass its tokens drew."""

    start: int  # char span in the chunk's document
    end: int
    text: str
    weight: float
    share: float  # weight / the chunk's mass_share
    query_tokens: list[QueryToken]


@dataclass(**_FROZEN)
class EvidenceItem:
    """One retrieved chunk, ranked by its share of the memory's attention mass (0 = the most): of the
    memory layer over the input (inference), or of the memory layers over the answer's tokens (generation)."""

    rank: int
    chunk_id: str
    doc_id: str
    text: str
    start: int
    end: int
    label: str | None
    metadata: dict[str, Any]
    similarity: float  # s_c, what R was ranked and weighted by
    dense_similarity: float  # e_q·e_c
    bm25: float | None  # None: dense retrieval
    matched_terms: list[str] | None
    weight: float  # w_db(c)
    mass_share: float
    influence: float | None  # None: not computed (generation)
    spans: list[Span]
    query_tokens: list[QueryToken]
    tokens: list[int] | None = None  # generation: query_tokens' indexes (the name the answer first had); else None


@dataclass(**_FROZEN)
class Diagnostics:
    memory_share: float
    retrieved: int
    k: int
    alpha: float | None  # None: joint mixing
    mixing: str
    knn_temperature: float  # τ
    temperature: float  # deprecated echo of knn_temperature (its name before one word had one meaning)
    kernel: str
    threshold: float | None
    retrieval: str
    lexical_weight: float | None
    candidates: int | None
    nearest_similarity: float
    search: str
    memory_layer: int
    w_db_entropy: float
    w_db_effective_k: float
    attention_entropy: float
    attention_effective_k: float
    attention_entropy_intra: float
    truncation_bound: float
    n_tokens: int
    truncated: bool
    filtered: int | None = None  # chunks that pass the request's filter; None: no filter
    sources: dict[str, str] = field(default_factory=dict)  # parameter → request | settings | bundle | default


@dataclass(**_FROZEN)
class Token:
    index: int
    text: str
    start: int
    end: int
    special: bool
    memory_share: float


@dataclass(**_FROZEN)
class Neighbour:
    chunk_id: str
    label: str | None
    similarity: float


@dataclass(**_FROZEN)
class VersusPlain:
    cosine: float
    l2: float
    nearest_plain: list[Neighbour]
    nearest_augmented: list[Neighbour]


@dataclass(**_FROZEN)
class Prediction:
    """The top label or an explicit abstain (Engine._predict)."""

    prediction: str | None
    abstained: bool
    abstain_reason: str | None = None


@dataclass(**_FROZEN)
class InferResult:
    embedding: list[float]
    evidence: list[EvidenceItem]
    diagnostics: Diagnostics
    label_scores: dict[str, float] | None
    prediction: str | None
    abstained: bool
    abstain_reason: str | None = None
    tokens: list[Token] | None = None  # with return_tokens
    token_embeddings: list[list[float]] | None = None
    head_memory_share: list[list[float]] | None = None
    versus_plain: VersusPlain | None = None

    def truncated(self) -> InferResult:
        """This result with diagnostics.truncated set: the input was cut before the engine saw it."""
        return replace(self, diagnostics=replace(self.diagnostics, truncated=True))

    def to_dict(self) -> dict[str, Any]:
        """The JSON view (what the HTTP answer holds), as plain dicts and lists."""
        return asdict(self)
