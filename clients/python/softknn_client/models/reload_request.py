from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="ReloadRequest")


@_attrs_define
class ReloadRequest:
    """
    Attributes:
        bundle (str): bundle directory, as the server sees it, or a URI in object storage (s3://bucket/kb), fetched to
            the server's cache
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use, else the one named
            `default` (a name this key may not use answers 404 as one that does not exist)
    """

    bundle: str
    kb: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        bundle = self.bundle

        kb: None | str | Unset
        if isinstance(self.kb, Unset):
            kb = UNSET
        else:
            kb = self.kb

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle": bundle,
            }
        )
        if kb is not UNSET:
            field_dict["kb"] = kb

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        bundle = d.pop("bundle")

        def _parse_kb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        kb = _parse_kb(d.pop("kb", UNSET))

        reload_request = cls(
            bundle=bundle,
            kb=kb,
        )

        return reload_request
