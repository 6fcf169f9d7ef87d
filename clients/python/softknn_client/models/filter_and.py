from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.filter_match import FilterMatch
    from ..models.filter_not import FilterNot
    from ..models.filter_or import FilterOr


T = TypeVar("T", bound="FilterAnd")


@_attrs_define
class FilterAnd:
    """
    Attributes:
        and_ (list[FilterAnd | FilterMatch | FilterNot | FilterOr]): every filter holds
    """

    and_: list[FilterAnd | FilterMatch | FilterNot | FilterOr]

    def to_dict(self) -> dict[str, Any]:
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        and_ = []
        for and_item_data in self.and_:
            and_item: dict[str, Any]
            if isinstance(and_item_data, FilterMatch):
                and_item = and_item_data.to_dict()
            elif isinstance(and_item_data, FilterAnd):
                and_item = and_item_data.to_dict()
            elif isinstance(and_item_data, FilterOr):
                and_item = and_item_data.to_dict()
            else:
                and_item = and_item_data.to_dict()

            and_.append(and_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "and": and_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        d = dict(src_dict)
        and_ = []
        _and_ = d.pop("and")
        for and_item_data in _and_:

            def _parse_and_item(data: object) -> FilterAnd | FilterMatch | FilterNot | FilterOr:
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    and_item_type_0 = FilterMatch.from_dict(data)

                    return and_item_type_0
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    and_item_type_1 = FilterAnd.from_dict(data)

                    return and_item_type_1
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    and_item_type_2 = FilterOr.from_dict(data)

                    return and_item_type_2
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                if not isinstance(data, dict):
                    raise TypeError()
                and_item_type_3 = FilterNot.from_dict(data)

                return and_item_type_3

            and_item = _parse_and_item(and_item_data)

            and_.append(and_item)

        filter_and = cls(
            and_=and_,
        )

        return filter_and
