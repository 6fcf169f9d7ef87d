from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="QueryToken")


@_attrs_define
class QueryToken:
    """
    Attributes:
        end (int):
        index (int): position of the token in the input's tokenization
        start (int): char span [start, end) in the input
        text (str): the token's text in the input ('[special]' for [CLS]/[SEP])
        weight (float): mean over heads of g_c·p_c mass this query token put on the chunk/span
    """

    end: int
    index: int
    start: int
    text: str
    weight: float

    def to_dict(self) -> dict[str, Any]:
        end = self.end

        index = self.index

        start = self.start

        text = self.text

        weight = self.weight

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "end": end,
                "index": index,
                "start": start,
                "text": text,
                "weight": weight,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        end = d.pop("end")

        index = d.pop("index")

        start = d.pop("start")

        text = d.pop("text")

        weight = d.pop("weight")

        query_token = cls(
            end=end,
            index=index,
            start=start,
            text=text,
            weight=weight,
        )

        return query_token
