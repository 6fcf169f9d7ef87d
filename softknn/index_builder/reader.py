"""Read a knowledge base into documents: JSONL, JSON arrays, CSV, and folders of .txt/.md.

Every error names the file and the line (or record) it comes from.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from softknn.common.errors import KBFormatError

TEXT_SUFFIXES = (".txt", ".md")
RECORD_SUFFIXES = (".jsonl", ".json", ".csv")


@dataclass(frozen=True)
class Fields:
    """Which record fields hold the id, the text and the label; other fields become metadata."""

    id: str | None = "id"
    text: str = "text"
    label: str | None = "label"


@dataclass
class Document:
    doc_id: str
    text: str
    label: str | None = None
    metadata: dict = field(default_factory=dict)
    source: str = ""  # "file:line" where it was read


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise KBFormatError(f"{path}:{line}: not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})") from e


def _record(rec: object, where: str, fields: Fields, default_id: str) -> Document:
    if not isinstance(rec, dict):
        raise KBFormatError(f"{where}: expected an object, got {type(rec).__name__}")
    text = rec.get(fields.text)
    if not isinstance(text, str) or not text.strip():
        raise KBFormatError(f"{where}: missing or empty text field {fields.text!r}")
    raw_id = rec.get(fields.id) if fields.id else None
    if fields.id and fields.id in rec and (raw_id is None or isinstance(raw_id, (dict, list))):
        raise KBFormatError(f"{where}: id field {fields.id!r} must be a string or number")
    doc_id = str(raw_id) if raw_id is not None and str(raw_id).strip() else default_id
    label = rec.get(fields.label) if fields.label else None
    if label is not None and (not isinstance(label, (str, int)) or isinstance(label, bool)):
        raise KBFormatError(f"{where}: label field {fields.label!r} must be a string")
    label = str(label) if label not in (None, "") else None
    meta = rec.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    extra = {k: v for k, v in rec.items() if k not in (fields.id, fields.text, fields.label, "metadata")}
    return Document(doc_id, text, label, {**extra, **meta}, where)


def record_document(rec: object, doc_id: str, where: str, fields: Fields = Fields()) -> Document:
    """One KB record (a dict without its id, as a write sends it) read by the builder's own rules:
    text required and non-empty, label a string, other fields into metadata."""
    if isinstance(rec, dict) and fields.id:
        rec = {k: v for k, v in rec.items() if k != fields.id}
    return _record(rec, where, Fields(None, fields.text, fields.label), doc_id)


def _jsonl(path: Path, fields: Fields) -> Iterator[Document]:
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise KBFormatError(f"{path}:{n}:{e.colno}: invalid JSON: {e.msg} (line {n}, column {e.colno})") from e
        yield _record(rec, f"{path}:{n}", fields, f"{path.stem}-{n}")


def _json(path: Path, fields: Fields) -> Iterator[Document]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise KBFormatError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from e
    if not isinstance(data, list):
        raise KBFormatError(f"{path}: expected a JSON array of records")
    for n, rec in enumerate(data):
        yield _record(rec, f"{path}[{n}]", fields, f"{path.stem}-{n}")


def _csv(path: Path, fields: Fields) -> Iterator[Document]:
    reader = csv.DictReader(_read_text(path).splitlines())
    if not reader.fieldnames or fields.text not in reader.fieldnames:
        raise KBFormatError(_missing_text(path, fields, list(reader.fieldnames or []), [], True))
    for n, row in enumerate(reader, start=2):
        yield _record(row, f"{path}:{n}", fields, f"{path.stem}-{n - 1}")


def _plain(path: Path, root: Path) -> Iterator[Document]:
    text = _read_text(path)
    if not text.strip():
        raise KBFormatError(f"{path}:1: empty file")
    rel = path.relative_to(root).as_posix() if path != root else path.name
    yield Document(rel, text, None, {"path": rel}, f"{path}:1")


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise KBFormatError(f"{root}: no such file or folder")
    suffixes = TEXT_SUFFIXES + RECORD_SUFFIXES
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not found:
        raise KBFormatError(f"{root}: no .jsonl, .json, .csv, .txt or .md files")
    return found


# --- field names: checked (and the text column inferred) before anything heavy loads ---------
PEEK_RECORDS = 20  # records per file looked at to tell a text column from a short label-like one


def _peek(path: Path) -> list[dict]:
    """The first PEEK_RECORDS records of a record file (dicts only; the full read reports the rest)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        reader = csv.DictReader(_read_text(path).splitlines())
        return [row for _, row in zip(range(PEEK_RECORDS), reader, strict=False)] or [dict.fromkeys(reader.fieldnames or [])]
    if suffix == ".jsonl":
        recs = []
        for line in _read_text(path).splitlines():
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # the full read names the line
            if len(recs) == PEEK_RECORDS:
                break
        return [r for r in recs if isinstance(r, dict)]
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError:
        return []
    return [r for r in data[:PEEK_RECORDS] if isinstance(r, dict)] if isinstance(data, list) else []


def _columns(recs: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for r in recs for k in r))


def _mean_len(recs: list[dict], col: str) -> float:
    vals = [r.get(col) for r in recs]
    return sum(len(v) for v in vals if isinstance(v, str)) / max(1, len(vals))


def resolve_fields(root: Path, fields: Fields, *, text_given: bool = False) -> tuple[Fields, list[str]]:
    """Check the field names against the KB's record files (their first records) and return
    (fields to read with, notes for the user).

    - the text field missing, not named by the user, and one column left that holds text (not the
      id or label field): that column is the text, and a note says so;
    - otherwise a missing text field is a KBFormatError naming the columns and the flags to pass;
    - no id field in the records: a note says ids are filled in (`<file stem>-<row>`).
    """
    root = Path(root)
    notes: list[str] = []
    files = [p for p in _files(root) if p.suffix.lower() in RECORD_SUFFIXES]
    for path in files:
        recs = _peek(path)
        cols = _columns(recs)
        if not cols or fields.text in cols:
            pass
        else:
            rest = [c for c in cols if c not in (fields.id, fields.label, "metadata")]
            texty = [c for c in rest if any(isinstance(v := r.get(c), str) and v.strip() for r in recs)]
            if len(texty) == 1 and not text_given:
                notes.append(f"{path.name}: no column {fields.text!r}; using {texty[0]!r} as the text "
                             f"(--text-field {texty[0]})")
                fields = Fields(fields.id, texty[0], fields.label)
            else:
                raise KBFormatError(_missing_text(path, fields, cols, recs, text_given))
        if fields.id and cols and fields.id not in cols:
            notes.append(f"{path.name}: no {fields.id!r} column: ids are filled in from the file name and the row "
                         f"({path.stem}-1, {path.stem}-2, …); --id-field names a column to use instead")
    return fields, notes


def _missing_text(path: Path, fields: Fields, cols: list[str], recs: list[dict], text_given: bool) -> str:
    """The error for a missing text field: the columns, and a command line that would read them."""
    where = f"{path}:1" if path.suffix.lower() == ".csv" else str(path)
    msg = f"{where}: no {'column' if path.suffix.lower() == '.csv' else 'field'} {fields.text!r} " \
          f"(columns: {', '.join(cols)})."
    by_len = sorted((c for c in cols if c not in (fields.id, "metadata")), key=lambda c: -_mean_len(recs, c))
    if not by_len:
        return msg + " Name the text column with --text-field."
    flags = [f"--text-field {by_len[0]}"]
    if fields.label not in cols and len(by_len) > 1:
        flags.append(f"--label-field {by_len[-1]}")
    hint = "the longest column" if len(by_len) > 1 else "the only column"
    why = f"({hint} as the text" + (", the shortest as the label)" if len(flags) > 1 else ")")
    return (msg + " Name the text column with --text-field (and the label and id columns with --label-field, "
            f"--id-field), e.g. {' '.join(flags)} {why}")


def read_kb(root: Path, fields: Fields = Fields()) -> list[Document]:
    """All documents under `root` (a file or a folder, walked in sorted order); ids must be unique."""
    root = Path(root)
    docs: list[Document] = []
    seen: dict[str, str] = {}
    for path in _files(root):
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            items = _jsonl(path, fields)
        elif suffix == ".json":
            items = _json(path, fields)
        elif suffix == ".csv":
            items = _csv(path, fields)
        elif suffix in TEXT_SUFFIXES:
            items = _plain(path, root if root.is_dir() else path.parent)
        else:
            raise KBFormatError(f"{path}: unsupported file type {suffix!r}")
        count = 0
        for doc in items:
            if doc.doc_id in seen:
                raise KBFormatError(f"{doc.source}: duplicate id {doc.doc_id!r} (first at {seen[doc.doc_id]})")
            seen[doc.doc_id] = doc.source
            docs.append(doc)
            count += 1
        if count == 0:
            raise KBFormatError(f"{path}:1: empty file (no records)")
    return docs
