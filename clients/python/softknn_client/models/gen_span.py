from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="GenSpan")


@_attrs_define
class GenSpan:
    """
    Attributes:
        end (int):
        start (int): char span [start, end) of the word in the chunk's document
        text (str):
        weight (float): share of the chunk's memory mass on this word's tokens
    """

    end: int
    start: int
    text: str
    weight: float

    def to_dict(self) -> dict[str, Any]:
        end = self.end

        start = self.start

        text = self.text

        weight = self.weight

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "end": end,
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

        start = d.pop("start")

        text = d.pop("text")

        weight = d.pop("weight")

        gen_span = cls(
            end=end,
            start=start,
            text=text,
            weight=weight,
        )

        return gen_span
