"""Reading KBs (every error names file and line) and chunking with char offsets."""

import json

import pytest

from softknn.common.errors import KBFormatError
from softknn.index_builder.chunker import chunk_documents
from softknn.index_builder.reader import Fields, read_kb


def _write(path, text, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_jsonl_csv_and_text_folders_are_read_with_labels_and_metadata(tmp_path):
    _write(tmp_path / "a.jsonl", '{"id": "x1", "text": "alpha", "label": "L", "metadata": {"k": 1}}\n\n{"id": 2, "text": "beta"}\n')
    _write(tmp_path / "b.csv", "text,category,other\ngamma,C,o1\n")
    _write(tmp_path / "notes" / "c.md", "# delta\nsome text\n")
    docs = read_kb(tmp_path, Fields(label="label"))
    assert [(d.doc_id, d.text, d.label) for d in docs] == [
        ("x1", "alpha", "L"), ("2", "beta", None), ("b-1", "gamma", None), ("notes/c.md", "# delta\nsome text\n", None)]
    assert docs[0].metadata == {"k": 1}
    csv_docs = read_kb(tmp_path / "b.csv", Fields(label="category"))
    assert (csv_docs[0].label, csv_docs[0].metadata) == ("C", {"other": "o1"})


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("kb.jsonl", '{"id": "a", "text": "ok"}\n{"id": "b"}\n', r"kb.jsonl:2: missing or empty text field 'text'"),
        ("kb.jsonl", '{"id": "a", "text": "ok"}\n{"id": "a", "text": "again"}\n', r"kb.jsonl:2: duplicate id 'a' \(first at .*kb.jsonl:1\)"),
        ("kb.jsonl", '{"id": "a", "text": "ok"}\n{not json\n', r"kb.jsonl:2:2: invalid JSON: Expecting property name enclosed in double quotes \(line 2, column 2\)$"),
        ("kb.jsonl", "", r"kb.jsonl:1: empty file"),
        ("kb.jsonl", '{"id": "a", "text": "ok", "label": true}\n', r"kb.jsonl:1: label field 'label' must be a string"),
        ("kb.jsonl", '{"id": "a", "text": "   "}\n', r"kb.jsonl:1: missing or empty text"),
        ("kb.csv", "body\nx\n", r"kb.csv:1: no column 'text'"),
        ("doc.txt", "", r"doc.txt:1: empty file"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, name, content, message):
    _write(tmp_path / name, content)
    with pytest.raises(KBFormatError, match=message):
        read_kb(tmp_path / name)


def test_undecodable_bytes_name_the_line(tmp_path):
    p = _write(tmp_path / "kb.jsonl", b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n', "wb")
    with pytest.raises(KBFormatError, match=r"kb.jsonl:2: not valid UTF-8"):
        read_kb(p)


def test_long_documents_chunk_with_overlap_and_exact_char_spans(encoder, tmp_path):
    words = [f"w{i}" for i in range(300)]
    text = "  " + " ".join(words) + "\n"
    _write(tmp_path / "long.txt", text)
    docs = read_kb(tmp_path)
    chunks = chunk_documents(docs, encoder.tokenizer, max_tokens=100, overlap=20)
    assert [c.chunk_id for c in chunks][:2] == ["long.txt#0", "long.txt#1"]
    for c in chunks:
        assert text[c.start : c.end] == c.text
        n = len(encoder.tokenizer(c.text, add_special_tokens=False)["input_ids"])
        assert n <= 100
    assert chunks[0].start == 2 and chunks[-1].end == len(text) - 1  # covers the document
    # consecutive chunks overlap: the next one starts inside the previous one
    assert all(b.start < a.end for a, b in zip(chunks, chunks[1:]))


def test_short_documents_are_one_chunk_with_the_document_id(encoder, tmp_path):
    _write(tmp_path / "kb.jsonl", json.dumps({"id": "q1", "text": " short text "}) + "\n")
    [c] = chunk_documents(read_kb(tmp_path), encoder.tokenizer, max_tokens=100, overlap=10)
    assert (c.chunk_id, c.doc_id, c.text, c.start, c.end) == ("q1", "q1", "short text", 1, 11)
