from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ReloadRequest")


@_attrs_define
class ReloadRequest:
    """
    Attributes:
        bundle (str): bundle directory, as the server sees it
    """

    bundle: str

    def to_dict(self) -> dict[str, Any]:
        bundle = self.bundle

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle": bundle,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        bundle = d.pop("bundle")

        reload_request = cls(
            bundle=bundle,
        )

        return reload_request
