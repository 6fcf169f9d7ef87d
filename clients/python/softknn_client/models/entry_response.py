from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.entry import Entry


T = TypeVar("T", bound="EntryResponse")


@_attrs_define
class EntryResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        entry (Entry):
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        request_id (str):
    """

    bundle_version: str
    entry: Entry
    model: str
    model_fingerprint: str
    request_id: str

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        entry = self.entry.to_dict()

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "entry": entry,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "request_id": request_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.entry import Entry  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        entry = Entry.from_dict(d.pop("entry"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        entry_response = cls(
            bundle_version=bundle_version,
            entry=entry,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
        )

        return entry_response
