from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.infer_request_kernel import InferRequestKernel, check_infer_request_kernel
from ..models.infer_request_mixing import InferRequestMixing, check_infer_request_mixing
from ..models.infer_request_retrieval_type_0 import InferRequestRetrievalType0, check_infer_request_retrieval_type_0
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.filter_and import FilterAnd
    from ..models.filter_match import FilterMatch
    from ..models.filter_not import FilterNot
    from ..models.filter_or import FilterOr


T = TypeVar("T", bound="InferRequest")


@_attrs_define
class InferRequest:
    """Knowledge-augmented inference over one or more texts; every field but `inputs` is optional, and one left unset
    (null) takes the server's setting (SOFTKNN_DEFAULTS__*), else the bundle's own, else the default it names.

        Attributes:
            inputs (list[str]): 1..limits.max_inputs (64 by default) non-empty texts, each ≤ limits.max_chars (20000 by
                default) characters (longer ones need `truncate`) and ≤ the model's token limit (or `truncate`)
            alpha (float | Unset): fixed mixing: weight of the input's own attention, out = α·attn_intra + (1−α)·attn_db
                (seed 000 §4.3); ignored by joint mixing; left out: the server's setting, 0.7 by default
            evidence (int | Unset): evidence items returned per input; left out: the server's setting, 5 by default; at most
                the server's limits.max_evidence (50 by default)
            exact (bool | Unset): exact (brute-force) search instead of the ANN index; with hybrid or lexical retrieval, the
                similarity computed over every chunk
            filter_ (FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset): R is drawn from the chunks that pass
                this filter only: {field, eq|in|gt|gte|lt|lte} on doc_id, chunk_id, label or metadata.NAME, combined with {and:
                [...]}, {or: [...]}, {not: ...}; ≤ 8 levels, ≤ 64 objects, ≤ 10000 `in` values; null = every chunk
            k (int | Unset): KB chunks retrieved by the external k-NN; left out: the server's setting, 8 by default; at most
                the server's limits.max_k (256 by default)
            kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use, else the one named
                `default` (a name this key may not use answers 404 as one that does not exist)
            kernel (InferRequestKernel | Unset): k-NN kernel (seed 001), bandwidth h² = τ; left out: the server's setting,
                softmax by default
            knn_temperature (float | None | Unset): k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel (h² = τ for
                the others); null = the bundle's calibrated τ, else the retrieval's own default (docs/quality.md)
            lexical_weight (float | None | Unset): λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the
                bundle's build chose (labelled KBs by leave-one-out, unlabelled by pseudo-queries), else 0.6
            mixing (InferRequestMixing | Unset): fixed: the α rule; joint: one softmax over input and retrieved tokens
                (memory share is reported); left out: the server's setting, fixed by default
            retrieval (InferRequestRetrievalType0 | None | Unset): similarity s_c of the external k-NN: dense e_q·e_c,
                lexical BM25, or hybrid (1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid
                where the bundle has a lexical index, else dense
            return_tokens (bool | Unset): also return per-token outputs: tokens, token_embeddings, head_memory_share, and
                versus_plain (the change against the plain model)
            spans (int | Unset): highlighted word spans per evidence item; left out: the server's setting, 5 by default
            temperature (float | None | Unset): deprecated: use knn_temperature
            threshold (float | None | Unset): top-k + threshold: also keep chunks of the hybrid_pool candidates whose weight
                is ≥ threshold (seed 000 §5.3)
            truncate (bool | Unset): cut inputs over the character or token limit instead of refusing them (413)
    """

    inputs: list[str]
    alpha: float | Unset = UNSET
    evidence: int | Unset = UNSET
    exact: bool | Unset = UNSET
    filter_: FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset = UNSET
    k: int | Unset = UNSET
    kb: None | str | Unset = UNSET
    kernel: InferRequestKernel | Unset = UNSET
    knn_temperature: float | None | Unset = UNSET
    lexical_weight: float | None | Unset = UNSET
    mixing: InferRequestMixing | Unset = UNSET
    retrieval: InferRequestRetrievalType0 | None | Unset = UNSET
    return_tokens: bool | Unset = UNSET
    spans: int | Unset = UNSET
    temperature: float | None | Unset = UNSET
    threshold: float | None | Unset = UNSET
    truncate: bool | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        inputs = self.inputs

        alpha = self.alpha

        evidence = self.evidence

        exact = self.exact

        filter_: dict[str, Any] | None | Unset
        if isinstance(self.filter_, Unset):
            filter_ = UNSET
        elif isinstance(self.filter_, FilterMatch):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterAnd):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterOr):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterNot):
            filter_ = self.filter_.to_dict()
        else:
            filter_ = self.filter_

        k = self.k

        kb: None | str | Unset
        if isinstance(self.kb, Unset):
            kb = UNSET
        else:
            kb = self.kb

        kernel: str | Unset = UNSET
        if not isinstance(self.kernel, Unset):
            kernel = self.kernel

        knn_temperature: float | None | Unset
        if isinstance(self.knn_temperature, Unset):
            knn_temperature = UNSET
        else:
            knn_temperature = self.knn_temperature

        lexical_weight: float | None | Unset
        if isinstance(self.lexical_weight, Unset):
            lexical_weight = UNSET
        else:
            lexical_weight = self.lexical_weight

        mixing: str | Unset = UNSET
        if not isinstance(self.mixing, Unset):
            mixing = self.mixing

        retrieval: None | str | Unset
        if isinstance(self.retrieval, Unset):
            retrieval = UNSET
        elif isinstance(self.retrieval, str):
            retrieval = self.retrieval
        else:
            retrieval = self.retrieval

        return_tokens = self.return_tokens

        spans = self.spans

        temperature: float | None | Unset
        if isinstance(self.temperature, Unset):
            temperature = UNSET
        else:
            temperature = self.temperature

        threshold: float | None | Unset
        if isinstance(self.threshold, Unset):
            threshold = UNSET
        else:
            threshold = self.threshold

        truncate = self.truncate

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "inputs": inputs,
            }
        )
        if alpha is not UNSET:
            field_dict["alpha"] = alpha
        if evidence is not UNSET:
            field_dict["evidence"] = evidence
        if exact is not UNSET:
            field_dict["exact"] = exact
        if filter_ is not UNSET:
            field_dict["filter"] = filter_
        if k is not UNSET:
            field_dict["k"] = k
        if kb is not UNSET:
            field_dict["kb"] = kb
        if kernel is not UNSET:
            field_dict["kernel"] = kernel
        if knn_temperature is not UNSET:
            field_dict["knn_temperature"] = knn_temperature
        if lexical_weight is not UNSET:
            field_dict["lexical_weight"] = lexical_weight
        if mixing is not UNSET:
            field_dict["mixing"] = mixing
        if retrieval is not UNSET:
            field_dict["retrieval"] = retrieval
        if return_tokens is not UNSET:
            field_dict["return_tokens"] = return_tokens
        if spans is not UNSET:
            field_dict["spans"] = spans
        if temperature is not UNSET:
            field_dict["temperature"] = temperature
        if threshold is not UNSET:
            field_dict["threshold"] = threshold
        if truncate is not UNSET:
            field_dict["truncate"] = truncate

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        d = dict(src_dict)
        inputs = cast(list[str], d.pop("inputs"))

        alpha = d.pop("alpha", UNSET)

        evidence = d.pop("evidence", UNSET)

        exact = d.pop("exact", UNSET)

        def _parse_filter_(data: object) -> FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_0 = FilterMatch.from_dict(data)

                return filter_type_0_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_1 = FilterAnd.from_dict(data)

                return filter_type_0_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_2 = FilterOr.from_dict(data)

                return filter_type_0_type_2
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_3 = FilterNot.from_dict(data)

                return filter_type_0_type_3
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset, data)

        filter_ = _parse_filter_(d.pop("filter", UNSET))

        k = d.pop("k", UNSET)

        def _parse_kb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        kb = _parse_kb(d.pop("kb", UNSET))

        _kernel = d.pop("kernel", UNSET)
        kernel: InferRequestKernel | Unset
        if isinstance(_kernel, Unset):
            kernel = UNSET
        else:
            kernel = check_infer_request_kernel(_kernel)

        def _parse_knn_temperature(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        knn_temperature = _parse_knn_temperature(d.pop("knn_temperature", UNSET))

        def _parse_lexical_weight(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        lexical_weight = _parse_lexical_weight(d.pop("lexical_weight", UNSET))

        _mixing = d.pop("mixing", UNSET)
        mixing: InferRequestMixing | Unset
        if isinstance(_mixing, Unset):
            mixing = UNSET
        else:
            mixing = check_infer_request_mixing(_mixing)

        def _parse_retrieval(data: object) -> InferRequestRetrievalType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                retrieval_type_0 = check_infer_request_retrieval_type_0(data)

                return retrieval_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(InferRequestRetrievalType0 | None | Unset, data)

        retrieval = _parse_retrieval(d.pop("retrieval", UNSET))

        return_tokens = d.pop("return_tokens", UNSET)

        spans = d.pop("spans", UNSET)

        def _parse_temperature(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        temperature = _parse_temperature(d.pop("temperature", UNSET))

        def _parse_threshold(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        threshold = _parse_threshold(d.pop("threshold", UNSET))

        truncate = d.pop("truncate", UNSET)

        infer_request = cls(
            inputs=inputs,
            alpha=alpha,
            evidence=evidence,
            exact=exact,
            filter_=filter_,
            k=k,
            kb=kb,
            kernel=kernel,
            knn_temperature=knn_temperature,
            lexical_weight=lexical_weight,
            mixing=mixing,
            retrieval=retrieval,
            return_tokens=return_tokens,
            spans=spans,
            temperature=temperature,
            threshold=threshold,
            truncate=truncate,
        )

        return infer_request
