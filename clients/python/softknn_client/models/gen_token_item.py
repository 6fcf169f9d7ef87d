from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="GenTokenItem")


@_attrs_define
class GenTokenItem:
    """
    Attributes:
        index (int):
        memory_share (float): Σ_c g_c for the step that produced it (0 without memory)
        text (str): the text this token added
        top_chunk (None | str): the chunk it drew on most
    """

    index: int
    memory_share: float
    text: str
    top_chunk: None | str

    def to_dict(self) -> dict[str, Any]:
        index = self.index

        memory_share = self.memory_share

        text = self.text

        top_chunk: None | str
        top_chunk = self.top_chunk

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "index": index,
                "memory_share": memory_share,
                "text": text,
                "top_chunk": top_chunk,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        index = d.pop("index")

        memory_share = d.pop("memory_share")

        text = d.pop("text")

        def _parse_top_chunk(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        top_chunk = _parse_top_chunk(d.pop("top_chunk"))

        gen_token_item = cls(
            index=index,
            memory_share=memory_share,
            text=text,
            top_chunk=top_chunk,
        )

        return gen_token_item
