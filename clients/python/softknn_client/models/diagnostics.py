from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.diagnostics_mixing import DiagnosticsMixing, check_diagnostics_mixing
from ..models.diagnostics_retrieval import DiagnosticsRetrieval, check_diagnostics_retrieval
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.diagnostics_sources import DiagnosticsSources


T = TypeVar("T", bound="Diagnostics")


@_attrs_define
class Diagnostics:
    """
    Attributes:
        alpha (float | None): α used (null for joint mixing)
        attention_effective_k (float):
        attention_entropy (float): entropy of the fused attention distribution, mean over heads/tokens
        attention_entropy_intra (float): entropy of the input's own attention alone
        candidates (int | None): hybrid/lexical: each retriever's top m considered
        filtered (int | None): chunks that pass the request's filter, the KB R was drawn from (null: no filter)
        k (int):
        kernel (str):
        knn_temperature (float): τ used (the request's, else the bundle's or the retrieval's default)
        lexical_weight (float | None): λ used (hybrid only)
        memory_layer (int):
        memory_share (float): mean over heads and query tokens of the memory's gate mass
        mixing (DiagnosticsMixing):
        n_tokens (int):
        nearest_similarity (float): largest e_q·e_c over the KB (the abstain rule's s_1)
        retrieval (DiagnosticsRetrieval): the similarity R was ranked by
        retrieved (int): |R|, chunks the fused layer attended
        search (str): 'exact' or the ANN index kind that answered
        temperature (float): deprecated: use knn_temperature (the same τ, echoed under its old name)
        threshold (float | None):
        truncated (bool): true when the input was cut to the token or character limit
        truncation_bound (float): upper bound on the kernel mass lost to top-k truncation
        w_db_effective_k (float): exp(H(w_db))
        w_db_entropy (float): entropy H of w_db (nats)
        sources (DiagnosticsSources | Unset): where each parameter's value came from: request (the request or the
            command's option), settings (the server's SOFTKNN_DEFAULTS__* / SOFTKNN_GENERATE__*), bundle (its calibration or
            its indexes) or default (the parameter's declared default)
    """

    alpha: float | None
    attention_effective_k: float
    attention_entropy: float
    attention_entropy_intra: float
    candidates: int | None
    filtered: int | None
    k: int
    kernel: str
    knn_temperature: float
    lexical_weight: float | None
    memory_layer: int
    memory_share: float
    mixing: DiagnosticsMixing
    n_tokens: int
    nearest_similarity: float
    retrieval: DiagnosticsRetrieval
    retrieved: int
    search: str
    temperature: float
    threshold: float | None
    truncated: bool
    truncation_bound: float
    w_db_effective_k: float
    w_db_entropy: float
    sources: DiagnosticsSources | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        alpha: float | None
        alpha = self.alpha

        attention_effective_k = self.attention_effective_k

        attention_entropy = self.attention_entropy

        attention_entropy_intra = self.attention_entropy_intra

        candidates: int | None
        candidates = self.candidates

        filtered: int | None
        filtered = self.filtered

        k = self.k

        kernel = self.kernel

        knn_temperature = self.knn_temperature

        lexical_weight: float | None
        lexical_weight = self.lexical_weight

        memory_layer = self.memory_layer

        memory_share = self.memory_share

        mixing: str = self.mixing

        n_tokens = self.n_tokens

        nearest_similarity = self.nearest_similarity

        retrieval: str = self.retrieval

        retrieved = self.retrieved

        search = self.search

        temperature = self.temperature

        threshold: float | None
        threshold = self.threshold

        truncated = self.truncated

        truncation_bound = self.truncation_bound

        w_db_effective_k = self.w_db_effective_k

        w_db_entropy = self.w_db_entropy

        sources: dict[str, Any] | Unset = UNSET
        if not isinstance(self.sources, Unset):
            sources = self.sources.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "alpha": alpha,
                "attention_effective_k": attention_effective_k,
                "attention_entropy": attention_entropy,
                "attention_entropy_intra": attention_entropy_intra,
                "candidates": candidates,
                "filtered": filtered,
                "k": k,
                "kernel": kernel,
                "knn_temperature": knn_temperature,
                "lexical_weight": lexical_weight,
                "memory_layer": memory_layer,
                "memory_share": memory_share,
                "mixing": mixing,
                "n_tokens": n_tokens,
                "nearest_similarity": nearest_similarity,
                "retrieval": retrieval,
                "retrieved": retrieved,
                "search": search,
                "temperature": temperature,
                "threshold": threshold,
                "truncated": truncated,
                "truncation_bound": truncation_bound,
                "w_db_effective_k": w_db_effective_k,
                "w_db_entropy": w_db_entropy,
            }
        )
        if sources is not UNSET:
            field_dict["sources"] = sources

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.diagnostics_sources import DiagnosticsSources  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_alpha(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        alpha = _parse_alpha(d.pop("alpha"))

        attention_effective_k = d.pop("attention_effective_k")

        attention_entropy = d.pop("attention_entropy")

        attention_entropy_intra = d.pop("attention_entropy_intra")

        def _parse_candidates(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        candidates = _parse_candidates(d.pop("candidates"))

        def _parse_filtered(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        filtered = _parse_filtered(d.pop("filtered"))

        k = d.pop("k")

        kernel = d.pop("kernel")

        knn_temperature = d.pop("knn_temperature")

        def _parse_lexical_weight(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        lexical_weight = _parse_lexical_weight(d.pop("lexical_weight"))

        memory_layer = d.pop("memory_layer")

        memory_share = d.pop("memory_share")

        mixing = check_diagnostics_mixing(d.pop("mixing"))

        n_tokens = d.pop("n_tokens")

        nearest_similarity = d.pop("nearest_similarity")

        retrieval = check_diagnostics_retrieval(d.pop("retrieval"))

        retrieved = d.pop("retrieved")

        search = d.pop("search")

        temperature = d.pop("temperature")

        def _parse_threshold(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        threshold = _parse_threshold(d.pop("threshold"))

        truncated = d.pop("truncated")

        truncation_bound = d.pop("truncation_bound")

        w_db_effective_k = d.pop("w_db_effective_k")

        w_db_entropy = d.pop("w_db_entropy")

        _sources = d.pop("sources", UNSET)
        sources: DiagnosticsSources | Unset
        if isinstance(_sources, Unset):
            sources = UNSET
        else:
            sources = DiagnosticsSources.from_dict(_sources)

        diagnostics = cls(
            alpha=alpha,
            attention_effective_k=attention_effective_k,
            attention_entropy=attention_entropy,
            attention_entropy_intra=attention_entropy_intra,
            candidates=candidates,
            filtered=filtered,
            k=k,
            kernel=kernel,
            knn_temperature=knn_temperature,
            lexical_weight=lexical_weight,
            memory_layer=memory_layer,
            memory_share=memory_share,
            mixing=mixing,
            n_tokens=n_tokens,
            nearest_similarity=nearest_similarity,
            retrieval=retrieval,
            retrieved=retrieved,
            search=search,
            temperature=temperature,
            threshold=threshold,
            truncated=truncated,
            truncation_bound=truncation_bound,
            w_db_effective_k=w_db_effective_k,
            w_db_entropy=w_db_entropy,
            sources=sources,
        )

        return diagnostics
