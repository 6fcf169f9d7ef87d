from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="EmbeddingData")


@_attrs_define
class EmbeddingData:
    """
    Attributes:
        embedding (list[float] | str): the pooled, normalised sentence embedding: numbers, or (encoding_format base64)
            its little-endian float32 bytes in base64
        index (int): position of the text in `input`
        object_ (Literal['embedding']):
    """

    embedding: list[float] | str
    index: int
    object_: Literal["embedding"]

    def to_dict(self) -> dict[str, Any]:
        embedding: list[float] | str
        if isinstance(self.embedding, list):
            embedding = self.embedding

        else:
            embedding = self.embedding

        index = self.index

        object_ = self.object_

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "embedding": embedding,
                "index": index,
                "object": object_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_embedding(data: object) -> list[float] | str:
            try:
                if not isinstance(data, list):
                    raise TypeError()
                embedding_type_0 = cast(list[float], data)

                return embedding_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[float] | str, data)

        embedding = _parse_embedding(d.pop("embedding"))

        index = d.pop("index")

        object_ = cast(Literal["embedding"], d.pop("object"))
        if object_ != "embedding":
            raise ValueError(f"object must match const 'embedding', got '{object_}'")

        embedding_data = cls(
            embedding=embedding,
            index=index,
            object_=object_,
        )

        return embedding_data
