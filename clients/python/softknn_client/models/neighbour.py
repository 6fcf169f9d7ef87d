from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="Neighbour")


@_attrs_define
class Neighbour:
    """
    Attributes:
        chunk_id (str):
        label (None | str):
        similarity (float): e·e_c, the embedding's dot product with the chunk's (exact search)
    """

    chunk_id: str
    label: None | str
    similarity: float

    def to_dict(self) -> dict[str, Any]:
        chunk_id = self.chunk_id

        label: None | str
        label = self.label

        similarity = self.similarity

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "chunk_id": chunk_id,
                "label": label,
                "similarity": similarity,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        chunk_id = d.pop("chunk_id")

        def _parse_label(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        label = _parse_label(d.pop("label"))

        similarity = d.pop("similarity")

        neighbour = cls(
            chunk_id=chunk_id,
            label=label,
            similarity=similarity,
        )

        return neighbour
