from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.neighbour import Neighbour


T = TypeVar("T", bound="VersusPlain")


@_attrs_define
class VersusPlain:
    """
    Attributes:
        cosine (float): cos(e, e') of the plain model's embedding e and the knowledge-augmented e'
        l2 (float): ‖e' − e‖
        nearest_augmented (list[Neighbour]): the KB chunks nearest e' (the knowledge-augmented one)
        nearest_plain (list[Neighbour]): the KB chunks nearest e (the plain model's embedding)
    """

    cosine: float
    l2: float
    nearest_augmented: list[Neighbour]
    nearest_plain: list[Neighbour]

    def to_dict(self) -> dict[str, Any]:
        cosine = self.cosine

        l2 = self.l2

        nearest_augmented = []
        for nearest_augmented_item_data in self.nearest_augmented:
            nearest_augmented_item = nearest_augmented_item_data.to_dict()
            nearest_augmented.append(nearest_augmented_item)

        nearest_plain = []
        for nearest_plain_item_data in self.nearest_plain:
            nearest_plain_item = nearest_plain_item_data.to_dict()
            nearest_plain.append(nearest_plain_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "cosine": cosine,
                "l2": l2,
                "nearest_augmented": nearest_augmented,
                "nearest_plain": nearest_plain,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.neighbour import Neighbour  # noqa: PLC0415

        d = dict(src_dict)
        cosine = d.pop("cosine")

        l2 = d.pop("l2")

        nearest_augmented = []
        _nearest_augmented = d.pop("nearest_augmented")
        for nearest_augmented_item_data in _nearest_augmented:
            nearest_augmented_item = Neighbour.from_dict(nearest_augmented_item_data)

            nearest_augmented.append(nearest_augmented_item)

        nearest_plain = []
        _nearest_plain = d.pop("nearest_plain")
        for nearest_plain_item_data in _nearest_plain:
            nearest_plain_item = Neighbour.from_dict(nearest_plain_item_data)

            nearest_plain.append(nearest_plain_item)

        versus_plain = cls(
            cosine=cosine,
            l2=l2,
            nearest_augmented=nearest_augmented,
            nearest_plain=nearest_plain,
        )

        return versus_plain
