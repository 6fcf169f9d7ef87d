from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="Token")


@_attrs_define
class Token:
    """
    Attributes:
        end (int):
        index (int):
        memory_share (float): memory gate mass at this token, mean over heads
        special (bool):
        start (int):
        text (str):
    """

    end: int
    index: int
    memory_share: float
    special: bool
    start: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        end = self.end

        index = self.index

        memory_share = self.memory_share

        special = self.special

        start = self.start

        text = self.text

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "end": end,
                "index": index,
                "memory_share": memory_share,
                "special": special,
                "start": start,
                "text": text,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        end = d.pop("end")

        index = d.pop("index")

        memory_share = d.pop("memory_share")

        special = d.pop("special")

        start = d.pop("start")

        text = d.pop("text")

        token = cls(
            end=end,
            index=index,
            memory_share=memory_share,
            special=special,
            start=start,
            text=text,
        )

        return token
