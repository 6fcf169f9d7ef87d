from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.document_out import DocumentOut


T = TypeVar("T", bound="DocumentResponse")


@_attrs_define
class DocumentResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        document (DocumentOut):
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        request_id (str):
    """

    bundle_version: str
    document: DocumentOut
    model: str
    model_fingerprint: str
    request_id: str

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        document = self.document.to_dict()

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "document": document,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "request_id": request_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.document_out import DocumentOut  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        document = DocumentOut.from_dict(d.pop("document"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        document_response = cls(
            bundle_version=bundle_version,
            document=document,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
        )

        return document_response
