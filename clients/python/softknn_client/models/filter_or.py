from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.filter_and import FilterAnd
    from ..models.filter_match import FilterMatch
    from ..models.filter_not import FilterNot


T = TypeVar("T", bound="FilterOr")


@_attrs_define
class FilterOr:
    """
    Attributes:
        or_ (list[FilterAnd | FilterMatch | FilterNot | FilterOr]): at least one filter holds
    """

    or_: list[FilterAnd | FilterMatch | FilterNot | FilterOr]

    def to_dict(self) -> dict[str, Any]:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415

        or_ = []
        for or_item_data in self.or_:
            or_item: dict[str, Any]
            if isinstance(or_item_data, FilterMatch):
                or_item = or_item_data.to_dict()
            elif isinstance(or_item_data, FilterAnd):
                or_item = or_item_data.to_dict()
            elif isinstance(or_item_data, FilterOr):
                or_item = or_item_data.to_dict()
            else:
                or_item = or_item_data.to_dict()

            or_.append(or_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "or": or_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415

        d = dict(src_dict)
        or_ = []
        _or_ = d.pop("or")
        for or_item_data in _or_:

            def _parse_or_item(data: object) -> FilterAnd | FilterMatch | FilterNot | FilterOr:
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    or_item_type_0 = FilterMatch.from_dict(data)

                    return or_item_type_0
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    or_item_type_1 = FilterAnd.from_dict(data)

                    return or_item_type_1
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    or_item_type_2 = FilterOr.from_dict(data)

                    return or_item_type_2
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                if not isinstance(data, dict):
                    raise TypeError()
                or_item_type_3 = FilterNot.from_dict(data)

                return or_item_type_3

            or_item = _parse_or_item(or_item_data)

            or_.append(or_item)

        filter_or = cls(
            or_=or_,
        )

        return filter_or
