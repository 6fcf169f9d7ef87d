from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.document_request_metadata_type_0 import DocumentRequestMetadataType0


T = TypeVar("T", bound="DocumentRequest")


@_attrs_define
class DocumentRequest:
    """A KB record without its id, as the builder reads one: fields other than these become metadata.

    Attributes:
        text (str): the document's text; its chunks replace the old ones
        label (int | None | str | Unset): the document's label (a labelled KB's class)
        metadata (DocumentRequestMetadataType0 | None | Unset): kept with every chunk, returned with its evidence
    """

    text: str
    label: int | None | str | Unset = UNSET
    metadata: DocumentRequestMetadataType0 | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.document_request_metadata_type_0 import DocumentRequestMetadataType0  # noqa: PLC0415

        text = self.text

        label: int | None | str | Unset
        if isinstance(self.label, Unset):
            label = UNSET
        else:
            label = self.label

        metadata: dict[str, Any] | None | Unset
        if isinstance(self.metadata, Unset):
            metadata = UNSET
        elif isinstance(self.metadata, DocumentRequestMetadataType0):
            metadata = self.metadata.to_dict()
        else:
            metadata = self.metadata

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "text": text,
            }
        )
        if label is not UNSET:
            field_dict["label"] = label
        if metadata is not UNSET:
            field_dict["metadata"] = metadata

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.document_request_metadata_type_0 import DocumentRequestMetadataType0  # noqa: PLC0415

        d = dict(src_dict)
        text = d.pop("text")

        def _parse_label(data: object) -> int | None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | str | Unset, data)

        label = _parse_label(d.pop("label", UNSET))

        def _parse_metadata(data: object) -> DocumentRequestMetadataType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                metadata_type_0 = DocumentRequestMetadataType0.from_dict(data)

                return metadata_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(DocumentRequestMetadataType0 | None | Unset, data)

        metadata = _parse_metadata(d.pop("metadata", UNSET))

        document_request = cls(
            text=text,
            label=label,
            metadata=metadata,
        )

        document_request.additional_properties = d
        return document_request

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
