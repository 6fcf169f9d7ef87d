from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.evidence_item_metadata import EvidenceItemMetadata
    from ..models.query_token import QueryToken
    from ..models.span import Span


T = TypeVar("T", bound="EvidenceItem")


@_attrs_define
class EvidenceItem:
    """
    Attributes:
        bm25 (float | None): BM25 score of the chunk for the input (null: dense retrieval)
        chunk_id (str):
        dense_similarity (float): e_q·e_c, the dense similarity
        doc_id (str):
        end (int):
        influence (float): ‖Δout‖/‖out‖ of the memory layer if this chunk were removed and the weights renormalised
            (closed form)
        label (None | str):
        mass_share (float): share of the layer's attention mass on this chunk (fixed: (1−α)·w_db); generation: its mean
            over the generated tokens
        matched_terms (list[str] | None): the input's words found in the chunk by the lexical index (after stemming;
            null: dense retrieval)
        metadata (EvidenceItemMetadata):
        query_tokens (list[QueryToken]): the input tokens that pulled this chunk most (≤ 5)
        rank (int): 0 = largest memory-mass share
        similarity (float): k-NN score s_c the chunk was ranked and weighted by (dense: e_q·e_c; hybrid: (1−λ)·dense +
            λ·BM25, normalised; lexical: BM25, normalised)
        spans (list[Span]):
        start (int): char span [start, end) of the chunk in its document
        text (str): the chunk's text
        weight (float): Nadaraya–Watson weight w_db(c) over the retrieved set R
        tokens (list[int] | None | Unset): null for an inference (a generated answer's: the indexes of its query_tokens
            in the answer's `tokens`)
    """

    bm25: float | None
    chunk_id: str
    dense_similarity: float
    doc_id: str
    end: int
    influence: float
    label: None | str
    mass_share: float
    matched_terms: list[str] | None
    metadata: EvidenceItemMetadata
    query_tokens: list[QueryToken]
    rank: int
    similarity: float
    spans: list[Span]
    start: int
    text: str
    weight: float
    tokens: list[int] | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        bm25: float | None
        bm25 = self.bm25

        chunk_id = self.chunk_id

        dense_similarity = self.dense_similarity

        doc_id = self.doc_id

        end = self.end

        influence = self.influence

        label: None | str
        label = self.label

        mass_share = self.mass_share

        matched_terms: list[str] | None
        if isinstance(self.matched_terms, list):
            matched_terms = self.matched_terms

        else:
            matched_terms = self.matched_terms

        metadata = self.metadata.to_dict()

        query_tokens = []
        for query_tokens_item_data in self.query_tokens:
            query_tokens_item = query_tokens_item_data.to_dict()
            query_tokens.append(query_tokens_item)

        rank = self.rank

        similarity = self.similarity

        spans = []
        for spans_item_data in self.spans:
            spans_item = spans_item_data.to_dict()
            spans.append(spans_item)

        start = self.start

        text = self.text

        weight = self.weight

        tokens: list[int] | None | Unset
        if isinstance(self.tokens, Unset):
            tokens = UNSET
        elif isinstance(self.tokens, list):
            tokens = self.tokens

        else:
            tokens = self.tokens

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bm25": bm25,
                "chunk_id": chunk_id,
                "dense_similarity": dense_similarity,
                "doc_id": doc_id,
                "end": end,
                "influence": influence,
                "label": label,
                "mass_share": mass_share,
                "matched_terms": matched_terms,
                "metadata": metadata,
                "query_tokens": query_tokens,
                "rank": rank,
                "similarity": similarity,
                "spans": spans,
                "start": start,
                "text": text,
                "weight": weight,
            }
        )
        if tokens is not UNSET:
            field_dict["tokens"] = tokens

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.evidence_item_metadata import EvidenceItemMetadata  # noqa: PLC0415
        from ..models.query_token import QueryToken  # noqa: PLC0415
        from ..models.span import Span  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_bm25(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        bm25 = _parse_bm25(d.pop("bm25"))

        chunk_id = d.pop("chunk_id")

        dense_similarity = d.pop("dense_similarity")

        doc_id = d.pop("doc_id")

        end = d.pop("end")

        influence = d.pop("influence")

        def _parse_label(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        label = _parse_label(d.pop("label"))

        mass_share = d.pop("mass_share")

        def _parse_matched_terms(data: object) -> list[str] | None:
            if data is None:
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                matched_terms_type_0 = cast(list[str], data)

                return matched_terms_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None, data)

        matched_terms = _parse_matched_terms(d.pop("matched_terms"))

        metadata = EvidenceItemMetadata.from_dict(d.pop("metadata"))

        query_tokens = []
        _query_tokens = d.pop("query_tokens")
        for query_tokens_item_data in _query_tokens:
            query_tokens_item = QueryToken.from_dict(query_tokens_item_data)

            query_tokens.append(query_tokens_item)

        rank = d.pop("rank")

        similarity = d.pop("similarity")

        spans = []
        _spans = d.pop("spans")
        for spans_item_data in _spans:
            spans_item = Span.from_dict(spans_item_data)

            spans.append(spans_item)

        start = d.pop("start")

        text = d.pop("text")

        weight = d.pop("weight")

        def _parse_tokens(data: object) -> list[int] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tokens_type_0 = cast(list[int], data)

                return tokens_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[int] | None | Unset, data)

        tokens = _parse_tokens(d.pop("tokens", UNSET))

        evidence_item = cls(
            bm25=bm25,
            chunk_id=chunk_id,
            dense_similarity=dense_similarity,
            doc_id=doc_id,
            end=end,
            influence=influence,
            label=label,
            mass_share=mass_share,
            matched_terms=matched_terms,
            metadata=metadata,
            query_tokens=query_tokens,
            rank=rank,
            similarity=similarity,
            spans=spans,
            start=start,
            text=text,
            weight=weight,
            tokens=tokens,
        )

        return evidence_item
