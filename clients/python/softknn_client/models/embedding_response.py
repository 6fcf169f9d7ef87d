from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.embedding_data import EmbeddingData
    from ..models.embedding_extra import EmbeddingExtra
    from ..models.embedding_usage import EmbeddingUsage


T = TypeVar("T", bound="EmbeddingResponse")


@_attrs_define
class EmbeddingResponse:
    """
    Attributes:
        data (list[EmbeddingData]):
        model (str):
        object_ (Literal['list']):
        softknn (EmbeddingExtra):
        usage (EmbeddingUsage):
    """

    data: list[EmbeddingData]
    model: str
    object_: Literal["list"]
    softknn: EmbeddingExtra
    usage: EmbeddingUsage

    def to_dict(self) -> dict[str, Any]:
        data = []
        for data_item_data in self.data:
            data_item = data_item_data.to_dict()
            data.append(data_item)

        model = self.model

        object_ = self.object_

        softknn = self.softknn.to_dict()

        usage = self.usage.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "data": data,
                "model": model,
                "object": object_,
                "softknn": softknn,
                "usage": usage,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.embedding_data import EmbeddingData  # noqa: PLC0415
        from ..models.embedding_extra import EmbeddingExtra  # noqa: PLC0415
        from ..models.embedding_usage import EmbeddingUsage  # noqa: PLC0415

        d = dict(src_dict)
        data = []
        _data = d.pop("data")
        for data_item_data in _data:
            data_item = EmbeddingData.from_dict(data_item_data)

            data.append(data_item)

        model = d.pop("model")

        object_ = cast(Literal["list"], d.pop("object"))
        if object_ != "list":
            raise ValueError(f"object must match const 'list', got '{object_}'")

        softknn = EmbeddingExtra.from_dict(d.pop("softknn"))

        usage = EmbeddingUsage.from_dict(d.pop("usage"))

        embedding_response = cls(
            data=data,
            model=model,
            object_=object_,
            softknn=softknn,
            usage=usage,
        )

        return embedding_response
