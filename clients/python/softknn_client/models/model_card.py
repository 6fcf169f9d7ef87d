from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="ModelCard")


@_attrs_define
class ModelCard:
    """
    Attributes:
        created (int):
        id (str):
        object_ (Literal['model']):
        owned_by (str):
    """

    created: int
    id: str
    object_: Literal["model"]
    owned_by: str

    def to_dict(self) -> dict[str, Any]:
        created = self.created

        id = self.id

        object_ = self.object_

        owned_by = self.owned_by

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "created": created,
                "id": id,
                "object": object_,
                "owned_by": owned_by,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        created = d.pop("created")

        id = d.pop("id")

        object_ = cast(Literal["model"], d.pop("object"))
        if object_ != "model":
            raise ValueError(f"object must match const 'model', got '{object_}'")

        owned_by = d.pop("owned_by")

        model_card = cls(
            created=created,
            id=id,
            object_=object_,
            owned_by=owned_by,
        )

        return model_card
