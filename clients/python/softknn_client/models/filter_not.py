from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.filter_and import FilterAnd
    from ..models.filter_match import FilterMatch
    from ..models.filter_or import FilterOr


T = TypeVar("T", bound="FilterNot")


@_attrs_define
class FilterNot:
    """
    Attributes:
        not_ (FilterAnd | FilterMatch | FilterNot | FilterOr): the filter does not hold
    """

    not_: FilterAnd | FilterMatch | FilterNot | FilterOr

    def to_dict(self) -> dict[str, Any]:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        not_: dict[str, Any]
        if isinstance(self.not_, FilterMatch):
            not_ = self.not_.to_dict()
        elif isinstance(self.not_, FilterAnd):
            not_ = self.not_.to_dict()
        elif isinstance(self.not_, FilterOr):
            not_ = self.not_.to_dict()
        else:
            not_ = self.not_.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "not": not_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_not_(data: object) -> FilterAnd | FilterMatch | FilterNot | FilterOr:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                not_type_0 = FilterMatch.from_dict(data)

                return not_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                not_type_1 = FilterAnd.from_dict(data)

                return not_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                not_type_2 = FilterOr.from_dict(data)

                return not_type_2
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            not_type_3 = FilterNot.from_dict(data)

            return not_type_3

        not_ = _parse_not_(d.pop("not"))

        filter_not = cls(
            not_=not_,
        )

        return filter_not
