from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.rerank_request_retrieval_type_0 import RerankRequestRetrievalType0, check_rerank_request_retrieval_type_0
from ..models.rerank_request_truncation_direction import (
    RerankRequestTruncationDirection,
    check_rerank_request_truncation_direction,
)
from ..types import UNSET, Unset

T = TypeVar("T", bound="RerankRequest")


@_attrs_define
class RerankRequest:
    """Score texts against a query with softknn's retrieval similarity (docs/design.md, "Rerank"); the similarity's
    parameters left unset (null) take the server's settings, else the bundle's own.

        Attributes:
            query (str): the query: non-empty, ≤ limits.max_chars (20000 by default) characters (or truncate)
            texts (list[str]): 1..limits.max_inputs (64 by default) non-empty texts to score
            exact (bool | Unset): the dense range over every chunk instead of the ANN index's top m
            kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use, else the one named
                `default` (a name this key may not use answers 404 as one that does not exist)
            lexical_weight (float | None | Unset): λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the
                bundle's build chose (labelled KBs by leave-one-out, unlabelled by pseudo-queries), else 0.6
            raw_scores (bool | Unset): false: s_t, in [0, 1] (a KB chunk's text scores its retrieval similarity); true: the
                same affine scores unclipped (hybrid and lexical) Default: False.
            retrieval (None | RerankRequestRetrievalType0 | Unset): similarity s_c of the external k-NN: dense e_q·e_c,
                lexical BM25, or hybrid (1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid
                where the bundle has a lexical index, else dense
            return_text (bool | Unset): return each text with its score Default: False.
            top_n (int | None | Unset): return the n best only (all: null)
            truncate (bool | Unset): cut inputs over the character or token limit instead of refusing them (413)
            truncation_direction (RerankRequestTruncationDirection | Unset): only right: a cut keeps the beginning Default:
                'right'.
    """

    query: str
    texts: list[str]
    exact: bool | Unset = UNSET
    kb: None | str | Unset = UNSET
    lexical_weight: float | None | Unset = UNSET
    raw_scores: bool | Unset = False
    retrieval: None | RerankRequestRetrievalType0 | Unset = UNSET
    return_text: bool | Unset = False
    top_n: int | None | Unset = UNSET
    truncate: bool | Unset = UNSET
    truncation_direction: RerankRequestTruncationDirection | Unset = "right"

    def to_dict(self) -> dict[str, Any]:
        query = self.query

        texts = self.texts

        exact = self.exact

        kb: None | str | Unset
        if isinstance(self.kb, Unset):
            kb = UNSET
        else:
            kb = self.kb

        lexical_weight: float | None | Unset
        if isinstance(self.lexical_weight, Unset):
            lexical_weight = UNSET
        else:
            lexical_weight = self.lexical_weight

        raw_scores = self.raw_scores

        retrieval: None | str | Unset
        if isinstance(self.retrieval, Unset):
            retrieval = UNSET
        elif isinstance(self.retrieval, str):
            retrieval = self.retrieval
        else:
            retrieval = self.retrieval

        return_text = self.return_text

        top_n: int | None | Unset
        if isinstance(self.top_n, Unset):
            top_n = UNSET
        else:
            top_n = self.top_n

        truncate = self.truncate

        truncation_direction: str | Unset = UNSET
        if not isinstance(self.truncation_direction, Unset):
            truncation_direction = self.truncation_direction

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "query": query,
                "texts": texts,
            }
        )
        if exact is not UNSET:
            field_dict["exact"] = exact
        if kb is not UNSET:
            field_dict["kb"] = kb
        if lexical_weight is not UNSET:
            field_dict["lexical_weight"] = lexical_weight
        if raw_scores is not UNSET:
            field_dict["raw_scores"] = raw_scores
        if retrieval is not UNSET:
            field_dict["retrieval"] = retrieval
        if return_text is not UNSET:
            field_dict["return_text"] = return_text
        if top_n is not UNSET:
            field_dict["top_n"] = top_n
        if truncate is not UNSET:
            field_dict["truncate"] = truncate
        if truncation_direction is not UNSET:
            field_dict["truncation_direction"] = truncation_direction

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        query = d.pop("query")

        texts = cast(list[str], d.pop("texts"))

        exact = d.pop("exact", UNSET)

        def _parse_kb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        kb = _parse_kb(d.pop("kb", UNSET))

        def _parse_lexical_weight(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        lexical_weight = _parse_lexical_weight(d.pop("lexical_weight", UNSET))

        raw_scores = d.pop("raw_scores", UNSET)

        def _parse_retrieval(data: object) -> None | RerankRequestRetrievalType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                retrieval_type_0 = check_rerank_request_retrieval_type_0(data)

                return retrieval_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | RerankRequestRetrievalType0 | Unset, data)

        retrieval = _parse_retrieval(d.pop("retrieval", UNSET))

        return_text = d.pop("return_text", UNSET)

        def _parse_top_n(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        top_n = _parse_top_n(d.pop("top_n", UNSET))

        truncate = d.pop("truncate", UNSET)

        _truncation_direction = d.pop("truncation_direction", UNSET)
        truncation_direction: RerankRequestTruncationDirection | Unset
        if isinstance(_truncation_direction, Unset):
            truncation_direction = UNSET
        else:
            truncation_direction = check_rerank_request_truncation_direction(_truncation_direction)

        rerank_request = cls(
            query=query,
            texts=texts,
            exact=exact,
            kb=kb,
            lexical_weight=lexical_weight,
            raw_scores=raw_scores,
            retrieval=retrieval,
            return_text=return_text,
            top_n=top_n,
            truncate=truncate,
            truncation_direction=truncation_direction,
        )

        return rerank_request
