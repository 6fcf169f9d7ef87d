"""The builder's part in KB writes (softknn.storage.writes.KBStore): a written document read by the
builder's rules and its chunks encoded by its code, so a version answers as a fresh build of its KB
does. The store takes it as its `documents` (softknn.storage.writes.DocumentBuilder): the storage
layer never imports the builder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from softknn.index_builder.chunker import Chunk, chunk_documents
from softknn.index_builder.pipeline import BuildConfig, encode_batch
from softknn.index_builder.reader import Document, Fields, read_kb, record_document
from softknn.storage.manifest import Manifest


def build_config(m: Manifest, encoder) -> BuildConfig:
    """The build settings the bundle of manifest `m` was built with, as its writes chunk and encode
    (chunk_tokens unset: the model's max_seq_length − 8, as the build's default)."""
    build = m.raw.get("build") or {}
    cfg = BuildConfig(layer=m.memory_layer, chunk_tokens=build.get("chunk_tokens"),
                      overlap=int(build.get("overlap", 32)), batch_size=int(build.get("batch_size", 32)),
                      kv_dtype=m.kv_dtype, memory=m.memory)
    if cfg.chunk_tokens is None:
        cfg.chunk_tokens = encoder.max_seq_length - 8
    return cfg


class BuilderDocuments:
    """softknn.storage.writes.DocumentBuilder by the builder's own functions."""

    def document(self, record: object, doc_id: str, where: str) -> Document:
        return record_document(record, doc_id, where)

    def encode(self, doc: Document, encoder, manifest: Manifest) -> tuple[list[Chunk], list[dict[str, np.ndarray]]]:
        cfg = build_config(manifest, encoder)
        with encoder.tokenizer_lock:
            chunks = chunk_documents([doc], encoder.tokenizer, int(cfg.chunk_tokens or 0), cfg.overlap)
        arrays = []
        for i in range(0, len(chunks), cfg.batch_size):
            part = chunks[i : i + cfg.batch_size]
            arrays.append(encode_batch(encoder, [c.text for c in part], [c.start for c in part],
                                       cfg.layer % encoder.info.num_layers, cfg))
        return chunks, arrays


def kb_documents(kb: Path, fields: Fields = Fields()) -> list[Document]:
    """The documents of a KB (a file or folder the builder reads), for `softknn add`."""
    return read_kb(Path(kb), fields)
