from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.entry_metadata import EntryMetadata


T = TypeVar("T", bound="Entry")


@_attrs_define
class Entry:
    """
    Attributes:
        chunk_id (str):
        doc_id (str):
        end (int):
        label (None | str):
        metadata (EntryMetadata):
        row (int): row of the chunk in the bundle
        start (int): char span [start, end) of the chunk in its document
        text (str): the chunk's text
        token_spans (list[list[int]]): char span in the document of each memory token
    """

    chunk_id: str
    doc_id: str
    end: int
    label: None | str
    metadata: EntryMetadata
    row: int
    start: int
    text: str
    token_spans: list[list[int]]

    def to_dict(self) -> dict[str, Any]:
        chunk_id = self.chunk_id

        doc_id = self.doc_id

        end = self.end

        label: None | str
        label = self.label

        metadata = self.metadata.to_dict()

        row = self.row

        start = self.start

        text = self.text

        token_spans = []
        for token_spans_item_data in self.token_spans:
            token_spans_item = []
            for token_spans_item_item_data in token_spans_item_data:
                token_spans_item_item: int
                token_spans_item_item = token_spans_item_item_data
                token_spans_item.append(token_spans_item_item)

            token_spans.append(token_spans_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "chunk_id": chunk_id,
                "doc_id": doc_id,
                "end": end,
                "label": label,
                "metadata": metadata,
                "row": row,
                "start": start,
                "text": text,
                "token_spans": token_spans,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.entry_metadata import EntryMetadata  # noqa: PLC0415

        d = dict(src_dict)
        chunk_id = d.pop("chunk_id")

        doc_id = d.pop("doc_id")

        end = d.pop("end")

        def _parse_label(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        label = _parse_label(d.pop("label"))

        metadata = EntryMetadata.from_dict(d.pop("metadata"))

        row = d.pop("row")

        start = d.pop("start")

        text = d.pop("text")

        token_spans = []
        _token_spans = d.pop("token_spans")
        for token_spans_item_data in _token_spans:
            token_spans_item = []
            _token_spans_item = token_spans_item_data
            for token_spans_item_item_data in _token_spans_item:

                def _parse_token_spans_item_item(data: object) -> int:
                    return cast(int, data)

                token_spans_item_item = _parse_token_spans_item_item(token_spans_item_item_data)

                token_spans_item.append(token_spans_item_item)

            token_spans.append(token_spans_item)

        entry = cls(
            chunk_id=chunk_id,
            doc_id=doc_id,
            end=end,
            label=label,
            metadata=metadata,
            row=row,
            start=start,
            text=text,
            token_spans=token_spans,
        )

        return entry
