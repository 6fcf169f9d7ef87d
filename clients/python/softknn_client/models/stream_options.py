from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="StreamOptions")


@_attrs_define
class StreamOptions:
    """
    Attributes:
        include_usage (bool | Unset): a last chunk with `usage` (and no choices) before [DONE] Default: False.
    """

    include_usage: bool | Unset = False

    def to_dict(self) -> dict[str, Any]:
        include_usage = self.include_usage

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if include_usage is not UNSET:
            field_dict["include_usage"] = include_usage

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        include_usage = d.pop("include_usage", UNSET)

        stream_options = cls(
            include_usage=include_usage,
        )

        return stream_options
