from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="FilterMatch")


@_attrs_define
class FilterMatch:
    """A leaf: the chunk's `field` compared with `eq`, `in`, or the range bounds.

    Attributes:
        field (str): doc_id, chunk_id, label, or metadata.NAME (nested keys joined by dots)
        eq (bool | float | None | str | Unset): equal to this string, number or boolean
        gt (float | None | Unset):
        gte (float | None | Unset):
        in_ (list[bool | float | str] | None | Unset): equal to one of these values
        lt (float | None | Unset):
        lte (float | None | Unset):
    """

    field: str
    eq: bool | float | None | str | Unset = UNSET
    gt: float | None | Unset = UNSET
    gte: float | None | Unset = UNSET
    in_: list[bool | float | str] | None | Unset = UNSET
    lt: float | None | Unset = UNSET
    lte: float | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        field = self.field

        eq: bool | float | None | str | Unset
        if isinstance(self.eq, Unset):
            eq = UNSET
        else:
            eq = self.eq

        gt: float | None | Unset
        if isinstance(self.gt, Unset):
            gt = UNSET
        else:
            gt = self.gt

        gte: float | None | Unset
        if isinstance(self.gte, Unset):
            gte = UNSET
        else:
            gte = self.gte

        in_: list[bool | float | str] | None | Unset
        if isinstance(self.in_, Unset):
            in_ = UNSET
        elif isinstance(self.in_, list):
            in_ = []
            for in_type_0_item_data in self.in_:
                in_type_0_item: bool | float | str
                in_type_0_item = in_type_0_item_data
                in_.append(in_type_0_item)

        else:
            in_ = self.in_

        lt: float | None | Unset
        if isinstance(self.lt, Unset):
            lt = UNSET
        else:
            lt = self.lt

        lte: float | None | Unset
        if isinstance(self.lte, Unset):
            lte = UNSET
        else:
            lte = self.lte

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "field": field,
            }
        )
        if eq is not UNSET:
            field_dict["eq"] = eq
        if gt is not UNSET:
            field_dict["gt"] = gt
        if gte is not UNSET:
            field_dict["gte"] = gte
        if in_ is not UNSET:
            field_dict["in"] = in_
        if lt is not UNSET:
            field_dict["lt"] = lt
        if lte is not UNSET:
            field_dict["lte"] = lte

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        field = d.pop("field")

        def _parse_eq(data: object) -> bool | float | None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | float | None | str | Unset, data)

        eq = _parse_eq(d.pop("eq", UNSET))

        def _parse_gt(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        gt = _parse_gt(d.pop("gt", UNSET))

        def _parse_gte(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        gte = _parse_gte(d.pop("gte", UNSET))

        def _parse_in_(data: object) -> list[bool | float | str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                in_type_0 = []
                _in_type_0 = data
                for in_type_0_item_data in _in_type_0:

                    def _parse_in_type_0_item(data: object) -> bool | float | str:
                        return cast(bool | float | str, data)

                    in_type_0_item = _parse_in_type_0_item(in_type_0_item_data)

                    in_type_0.append(in_type_0_item)

                return in_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[bool | float | str] | None | Unset, data)

        in_ = _parse_in_(d.pop("in", UNSET))

        def _parse_lt(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        lt = _parse_lt(d.pop("lt", UNSET))

        def _parse_lte(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        lte = _parse_lte(d.pop("lte", UNSET))

        filter_match = cls(
            field=field,
            eq=eq,
            gt=gt,
            gte=gte,
            in_=in_,
            lt=lt,
            lte=lte,
        )

        return filter_match
