from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.query_token import QueryToken


T = TypeVar("T", bound="GenSpan")


@_attrs_define
class GenSpan:
    """A Span of a generated answer's evidence: the same fields (this name kept for the clients that use it).

    Attributes:
        end (int):
        query_tokens (list[QueryToken]): the input tokens that pulled this span most (≤ 3; generation: none)
        share (float): weight / the chunk's mass_share
        start (int): char span [start, end) of the word in the chunk's document
        text (str):
        weight (float): memory mass on this word's tokens, mean over heads and query positions (generation: over the
            answer's tokens)
    """

    end: int
    query_tokens: list[QueryToken]
    share: float
    start: int
    text: str
    weight: float

    def to_dict(self) -> dict[str, Any]:
        end = self.end

        query_tokens = []
        for query_tokens_item_data in self.query_tokens:
            query_tokens_item = query_tokens_item_data.to_dict()
            query_tokens.append(query_tokens_item)

        share = self.share

        start = self.start

        text = self.text

        weight = self.weight

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "end": end,
                "query_tokens": query_tokens,
                "share": share,
                "start": start,
                "text": text,
                "weight": weight,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.query_token import QueryToken  # noqa: PLC0415

        d = dict(src_dict)
        end = d.pop("end")

        query_tokens = []
        _query_tokens = d.pop("query_tokens")
        for query_tokens_item_data in _query_tokens:
            query_tokens_item = QueryToken.from_dict(query_tokens_item_data)

            query_tokens.append(query_tokens_item)

        share = d.pop("share")

        start = d.pop("start")

        text = d.pop("text")

        weight = d.pop("weight")

        gen_span = cls(
            end=end,
            query_tokens=query_tokens,
            share=share,
            start=start,
            text=text,
            weight=weight,
        )

        return gen_span
