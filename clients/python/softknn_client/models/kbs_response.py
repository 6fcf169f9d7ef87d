from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.kb_info import KBInfo


T = TypeVar("T", bound="KbsResponse")


@_attrs_define
class KbsResponse:
    """
    Attributes:
        default (None | str): the KB a request that names none gets; null when the caller sees several and none is named
            `default` (then every request must name one)
        kbs (list[KBInfo]): the KBs this caller's credential may see, in the order served
        request_id (str):
        write (bool): whether this credential may write (PUT/DELETE /v1/documents) to these KBs
    """

    default: None | str
    kbs: list[KBInfo]
    request_id: str
    write: bool

    def to_dict(self) -> dict[str, Any]:
        default: None | str
        default = self.default

        kbs = []
        for kbs_item_data in self.kbs:
            kbs_item = kbs_item_data.to_dict()
            kbs.append(kbs_item)

        request_id = self.request_id

        write = self.write

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "default": default,
                "kbs": kbs,
                "request_id": request_id,
                "write": write,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.kb_info import KBInfo  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_default(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        default = _parse_default(d.pop("default"))

        kbs = []
        _kbs = d.pop("kbs")
        for kbs_item_data in _kbs:
            kbs_item = KBInfo.from_dict(kbs_item_data)

            kbs.append(kbs_item)

        request_id = d.pop("request_id")

        write = d.pop("write")

        kbs_response = cls(
            default=default,
            kbs=kbs,
            request_id=request_id,
            write=write,
        )

        return kbs_response
