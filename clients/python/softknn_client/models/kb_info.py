from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="KBInfo")


@_attrs_define
class KBInfo:
    """
    Attributes:
        bundle_version (None | str): version_id of the bundle it serves; null until it is ready
        chunks (int | None): chunks in that bundle; null until it is ready
        error (None | str): why it is not ready (no_bundle, failed); else null
        name (str): the KB's name: send it as `kb` (a body field on POST routes, a query parameter elsewhere)
        status (str): starting | ready | no_bundle | failed
    """

    bundle_version: None | str
    chunks: int | None
    error: None | str
    name: str
    status: str

    def to_dict(self) -> dict[str, Any]:
        bundle_version: None | str
        bundle_version = self.bundle_version

        chunks: int | None
        chunks = self.chunks

        error: None | str
        error = self.error

        name = self.name

        status = self.status

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "chunks": chunks,
                "error": error,
                "name": name,
                "status": status,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_bundle_version(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        bundle_version = _parse_bundle_version(d.pop("bundle_version"))

        def _parse_chunks(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        chunks = _parse_chunks(d.pop("chunks"))

        def _parse_error(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        error = _parse_error(d.pop("error"))

        name = d.pop("name")

        status = d.pop("status")

        kb_info = cls(
            bundle_version=bundle_version,
            chunks=chunks,
            error=error,
            name=name,
            status=status,
        )

        return kb_info
