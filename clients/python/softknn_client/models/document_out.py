from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.document_chunk import DocumentChunk
    from ..models.document_out_metadata import DocumentOutMetadata


T = TypeVar("T", bound="DocumentOut")


@_attrs_define
class DocumentOut:
    """
    Attributes:
        chunks (list[DocumentChunk]):
        doc_id (str):
        label (None | str):
        metadata (DocumentOutMetadata):
        text (None | str): the document's text where it is known whole: written through the API, or one chunk (its text
            is the document's, trimmed); else null
        written (bool): true when the document was written through the API (not by the build)
    """

    chunks: list[DocumentChunk]
    doc_id: str
    label: None | str
    metadata: DocumentOutMetadata
    text: None | str
    written: bool

    def to_dict(self) -> dict[str, Any]:
        chunks = []
        for chunks_item_data in self.chunks:
            chunks_item = chunks_item_data.to_dict()
            chunks.append(chunks_item)

        doc_id = self.doc_id

        label: None | str
        label = self.label

        metadata = self.metadata.to_dict()

        text: None | str
        text = self.text

        written = self.written

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "chunks": chunks,
                "doc_id": doc_id,
                "label": label,
                "metadata": metadata,
                "text": text,
                "written": written,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.document_chunk import DocumentChunk  # noqa: PLC0415
        from ..models.document_out_metadata import DocumentOutMetadata  # noqa: PLC0415

        d = dict(src_dict)
        chunks = []
        _chunks = d.pop("chunks")
        for chunks_item_data in _chunks:
            chunks_item = DocumentChunk.from_dict(chunks_item_data)

            chunks.append(chunks_item)

        doc_id = d.pop("doc_id")

        def _parse_label(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        label = _parse_label(d.pop("label"))

        metadata = DocumentOutMetadata.from_dict(d.pop("metadata"))

        def _parse_text(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        text = _parse_text(d.pop("text"))

        written = d.pop("written")

        document_out = cls(
            chunks=chunks,
            doc_id=doc_id,
            label=label,
            metadata=metadata,
            text=text,
            written=written,
        )

        return document_out
