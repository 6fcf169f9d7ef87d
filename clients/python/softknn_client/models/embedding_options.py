from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.embedding_options_kernel import EmbeddingOptionsKernel, check_embedding_options_kernel
from ..models.embedding_options_mixing import EmbeddingOptionsMixing, check_embedding_options_mixing
from ..models.embedding_options_retrieval_type_0 import (
    EmbeddingOptionsRetrievalType0,
    check_embedding_options_retrieval_type_0,
)
from ..types import UNSET, Unset

T = TypeVar("T", bound="EmbeddingOptions")


@_attrs_define
class EmbeddingOptions:
    """softknn's extension: `augmented: true` returns the knowledge-augmented embedding (the fused memory layer, as
    /v1/infer's `embedding`) with these retrieval parameters; `truncate` cuts over-long inputs instead of refusing them
    (413).

        Attributes:
            alpha (float | Unset): fixed mixing: weight of the input's own attention, out = α·attn_intra + (1−α)·attn_db
                (seed 000 §4.3); ignored by joint mixing; left out: the server's setting, 0.7 by default
            augmented (bool | Unset): false: the plain model's embedding; true: the knowledge-augmented one (/v1/infer's
                `embedding` with the parameters below) Default: False.
            exact (bool | Unset): exact (brute-force) search instead of the ANN index; with hybrid or lexical retrieval, the
                similarity computed over every chunk
            k (int | Unset): KB chunks retrieved by the external k-NN; left out: the server's setting, 8 by default; at most
                the server's limits.max_k (256 by default)
            kernel (EmbeddingOptionsKernel | Unset): k-NN kernel (seed 001), bandwidth h² = τ; left out: the server's
                setting, softmax by default
            knn_temperature (float | None | Unset): k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel (h² = τ for
                the others); null = the bundle's calibrated τ, else the retrieval's own default (docs/quality.md)
            lexical_weight (float | None | Unset): λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the
                bundle's build chose (labelled KBs by leave-one-out, unlabelled by pseudo-queries), else 0.6
            mixing (EmbeddingOptionsMixing | Unset): fixed: the α rule; joint: one softmax over input and retrieved tokens
                (memory share is reported); left out: the server's setting, fixed by default
            retrieval (EmbeddingOptionsRetrievalType0 | None | Unset): similarity s_c of the external k-NN: dense e_q·e_c,
                lexical BM25, or hybrid (1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid
                where the bundle has a lexical index, else dense
            temperature (float | None | Unset): deprecated: use knn_temperature
            threshold (float | None | Unset): top-k + threshold: also keep chunks of the hybrid_pool candidates whose weight
                is ≥ threshold (seed 000 §5.3)
            truncate (bool | Unset): cut inputs over the character or token limit instead of refusing them (413)
    """

    alpha: float | Unset = UNSET
    augmented: bool | Unset = False
    exact: bool | Unset = UNSET
    k: int | Unset = UNSET
    kernel: EmbeddingOptionsKernel | Unset = UNSET
    knn_temperature: float | None | Unset = UNSET
    lexical_weight: float | None | Unset = UNSET
    mixing: EmbeddingOptionsMixing | Unset = UNSET
    retrieval: EmbeddingOptionsRetrievalType0 | None | Unset = UNSET
    temperature: float | None | Unset = UNSET
    threshold: float | None | Unset = UNSET
    truncate: bool | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        alpha = self.alpha

        augmented = self.augmented

        exact = self.exact

        k = self.k

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

        field_dict.update({})
        if alpha is not UNSET:
            field_dict["alpha"] = alpha
        if augmented is not UNSET:
            field_dict["augmented"] = augmented
        if exact is not UNSET:
            field_dict["exact"] = exact
        if k is not UNSET:
            field_dict["k"] = k
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
        if temperature is not UNSET:
            field_dict["temperature"] = temperature
        if threshold is not UNSET:
            field_dict["threshold"] = threshold
        if truncate is not UNSET:
            field_dict["truncate"] = truncate

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        alpha = d.pop("alpha", UNSET)

        augmented = d.pop("augmented", UNSET)

        exact = d.pop("exact", UNSET)

        k = d.pop("k", UNSET)

        _kernel = d.pop("kernel", UNSET)
        kernel: EmbeddingOptionsKernel | Unset
        if isinstance(_kernel, Unset):
            kernel = UNSET
        else:
            kernel = check_embedding_options_kernel(_kernel)

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
        mixing: EmbeddingOptionsMixing | Unset
        if isinstance(_mixing, Unset):
            mixing = UNSET
        else:
            mixing = check_embedding_options_mixing(_mixing)

        def _parse_retrieval(data: object) -> EmbeddingOptionsRetrievalType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                retrieval_type_0 = check_embedding_options_retrieval_type_0(data)

                return retrieval_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EmbeddingOptionsRetrievalType0 | None | Unset, data)

        retrieval = _parse_retrieval(d.pop("retrieval", UNSET))

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

        embedding_options = cls(
            alpha=alpha,
            augmented=augmented,
            exact=exact,
            k=k,
            kernel=kernel,
            knn_temperature=knn_temperature,
            lexical_weight=lexical_weight,
            mixing=mixing,
            retrieval=retrieval,
            temperature=temperature,
            threshold=threshold,
            truncate=truncate,
        )

        return embedding_options
