"""Split documents into token windows with overlap, keeping each chunk's char span in its document."""

from __future__ import annotations

from dataclasses import dataclass, field

from softknn.index_builder.reader import Document


@dataclass
class Chunk:
    chunk_id: str
    doc_id: str
    text: str  # == document.text[start:end]
    start: int
    end: int
    label: str | None = None
    metadata: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "label": self.label,
            "metadata": self.metadata,
        }


def chunk_documents(docs: list[Document], tokenizer, max_tokens: int, overlap: int) -> list[Chunk]:
    """Windows of at most `max_tokens` tokens, consecutive windows sharing `overlap` tokens.

    A document that fits is one chunk with the document's id; longer ones become
    `doc_id#0`, `doc_id#1`, …, each the exact substring from its first token's start to its
    last token's end (so spans in chunk text plus `start` are spans in the document).
    """
    if not 0 <= overlap < max_tokens:
        raise ValueError(f"overlap must be in [0, {max_tokens}), got {overlap}")
    enc = tokenizer([d.text for d in docs], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    chunks: list[Chunk] = []
    for doc, offsets in zip(docs, enc["offset_mapping"], strict=True):
        offsets = [(s, e) for s, e in offsets if e > s]
        if len(offsets) <= max_tokens:
            start, end = _trim(doc.text, 0, len(doc.text))
            chunks.append(Chunk(doc.doc_id, doc.doc_id, doc.text[start:end], start, end, doc.label, doc.metadata))
            continue
        step = max_tokens - overlap
        for n, first in enumerate(range(0, len(offsets) - overlap, step)):
            window = offsets[first : first + max_tokens]
            start, end = window[0][0], window[-1][1]
            chunks.append(
                Chunk(f"{doc.doc_id}#{n}", doc.doc_id, doc.text[start:end], start, end, doc.label, doc.metadata)
            )
    return chunks


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
