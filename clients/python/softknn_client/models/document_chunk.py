from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="DocumentChunk")


@_attrs_define
class DocumentChunk:
    """
    Attributes:
        chunk_id (str):
        end (int):
        start (int): first char of the chunk in the document
        text (str):
    """

    chunk_id: str
    end: int
    start: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        chunk_id = self.chunk_id

        end = self.end

        start = self.start

        text = self.text

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "chunk_id": chunk_id,
                "end": end,
                "start": start,
                "text": text,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        chunk_id = d.pop("chunk_id")

        end = d.pop("end")

        start = d.pop("start")

        text = d.pop("text")

        document_chunk = cls(
            chunk_id=chunk_id,
            end=end,
            start=start,
            text=text,
        )

        return document_chunk
