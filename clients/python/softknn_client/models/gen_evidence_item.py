from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.gen_span import GenSpan


T = TypeVar("T", bound="GenEvidenceItem")


@_attrs_define
class GenEvidenceItem:
    """
    Attributes:
        bm25 (float | None):
        chunk_id (str):
        dense_similarity (float):
        doc_id (str):
        end (int):
        label (None | str):
        mass_share (float): mean over generated tokens of the memory mass g_c on this chunk
        rank (int): 1 = most memory mass over the answer
        similarity (float): s_c, what R was ranked and weighted by
        spans (list[GenSpan]): the chunk's words that drew the most mass
        start (int):
        text (str):
        tokens (list[int]): indexes into `tokens` of the generated tokens that drew on it most
        weight (float): w_db(c) over the retrieved set
    """

    bm25: float | None
    chunk_id: str
    dense_similarity: float
    doc_id: str
    end: int
    label: None | str
    mass_share: float
    rank: int
    similarity: float
    spans: list[GenSpan]
    start: int
    text: str
    tokens: list[int]
    weight: float

    def to_dict(self) -> dict[str, Any]:
        bm25: float | None
        bm25 = self.bm25

        chunk_id = self.chunk_id

        dense_similarity = self.dense_similarity

        doc_id = self.doc_id

        end = self.end

        label: None | str
        label = self.label

        mass_share = self.mass_share

        rank = self.rank

        similarity = self.similarity

        spans = []
        for spans_item_data in self.spans:
            spans_item = spans_item_data.to_dict()
            spans.append(spans_item)

        start = self.start

        text = self.text

        tokens = self.tokens

        weight = self.weight

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bm25": bm25,
                "chunk_id": chunk_id,
                "dense_similarity": dense_similarity,
                "doc_id": doc_id,
                "end": end,
                "label": label,
                "mass_share": mass_share,
                "rank": rank,
                "similarity": similarity,
                "spans": spans,
                "start": start,
                "text": text,
                "tokens": tokens,
                "weight": weight,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.gen_span import GenSpan  # noqa: PLC0415

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

        def _parse_label(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        label = _parse_label(d.pop("label"))

        mass_share = d.pop("mass_share")

        rank = d.pop("rank")

        similarity = d.pop("similarity")

        spans = []
        _spans = d.pop("spans")
        for spans_item_data in _spans:
            spans_item = GenSpan.from_dict(spans_item_data)

            spans.append(spans_item)

        start = d.pop("start")

        text = d.pop("text")

        tokens = cast(list[int], d.pop("tokens"))

        weight = d.pop("weight")

        gen_evidence_item = cls(
            bm25=bm25,
            chunk_id=chunk_id,
            dense_similarity=dense_similarity,
            doc_id=doc_id,
            end=end,
            label=label,
            mass_share=mass_share,
            rank=rank,
            similarity=similarity,
            spans=spans,
            start=start,
            text=text,
            tokens=tokens,
            weight=weight,
        )

        return gen_evidence_item
