"""A sharded bundle's chunk metadata memory-mapped from its shards' chunks.jsonl (issue 24 item 7).

The eager form (`eager_chunks`: a list of dicts and a {chunk_id: row} dict) holds every chunk's
text, spans and fields as Python objects in every replica: about 1.6 KB per chunk resident
(bench/chunk_metadata.py), 160 GB at 100M chunks. `MappedChunks` holds, per chunk, only its line's
byte offset (int64) and an 8-byte hash of its chunk_id with that hash's sorted position (uint64 +
int64): 24 B per chunk. A row is decoded (json.loads of its one line) only when indexed, i.e. for
the evidence of R; `row_of` is a binary search on the hashes, confirmed by decoding the candidate
row(s) (two ids of one hash are told apart).

Validation: every line is decoded once at load (for its chunk_id), so an unreadable or invalid line
is a BundleError naming the file and line at load, as with the eager list; the decoded objects are
dropped at once. The row counts are checked against the manifests by the caller (load_sharded).
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from softknn.common.errors import BundleError

_BLOCK = 1 << 26  # newline scan in 64 MiB blocks (a transient bool array of one block)


def id_hash(chunk_id: str) -> int:
    """A stable 8-byte hash of a chunk id (blake2b), as an unsigned integer."""
    return int.from_bytes(hashlib.blake2b(chunk_id.encode("utf-8"), digest_size=8).digest(), "little")


def _line_ends(buf) -> np.ndarray:
    """Byte offsets one past each line of `buf` (a line is up to and including its b'\\n'; a last
    line without one counts), int64, with a leading 0: line i is buf[ends[i]:ends[i + 1]]."""
    n = len(buf)
    view = np.frombuffer(buf, dtype=np.uint8) if n else np.zeros(0, dtype=np.uint8)
    parts = [np.zeros(1, dtype=np.int64)]
    for a in range(0, n, _BLOCK):
        parts.append(np.flatnonzero(view[a : a + _BLOCK] == 10).astype(np.int64) + (a + 1))
    ends = np.concatenate(parts)
    if n and ends[-1] != n:
        ends = np.append(ends, np.int64(n))
    return ends


def _decode(path: Path, line: int, raw: bytes) -> dict:
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path}: unreadable: line {line + 1}: {e}") from e


class MappedChunks(Sequence[dict]):
    """The chunks of several chunks.jsonl files (in order), row = position: read-only, decoded on access.

    `chunks[i]` (negative i from the end) decodes row i's line; `chunks[a:b]` a list of dicts;
    iteration decodes row after row. A decoded dict is a fresh object each time (mutating it changes
    nothing stored). `row_of(chunk_id)`: the row of that id (the last, when two rows share it, as
    the eager dict), or None."""

    def __init__(self, files: Sequence[str | Path]):
        self.files = [Path(f) for f in files]
        self._bufs: list = []
        ends, firsts, n = [], [], 0
        for f in self.files:
            try:
                with open(f, "rb") as fh:
                    size = fh.seek(0, 2)
                    buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            except OSError as e:
                raise BundleError(f"{f}: unreadable: {e}") from e
            e_ = _line_ends(buf)
            self._bufs.append(buf)
            ends.append(e_)
            firsts.append(n)
            n += len(e_) - 1
        self._ends, self._first, self._n = ends, np.asarray(firsts, dtype=np.int64), n
        hashes = np.empty(n, dtype=np.uint64)
        row = 0
        for s, f in enumerate(self.files):
            buf, e_ = self._bufs[s], ends[s]
            for i in range(len(e_) - 1):
                c = _decode(f, i, buf[e_[i] : e_[i + 1]])
                try:
                    hashes[row] = id_hash(c["chunk_id"])
                except (KeyError, TypeError, AttributeError) as err:
                    raise BundleError(f"{f}: line {i + 1}: a chunk without a string chunk_id ({err!r})") from err
                row += 1
        self._order = np.argsort(hashes, kind="stable")
        self._sorted = hashes[self._order]

    def __reduce__(self):  # an mmap does not pickle: a copy reopens the files
        return (MappedChunks, (self.files,))

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> dict:
        s = int(np.searchsorted(self._first, i, side="right")) - 1
        j = i - int(self._first[s])
        e_ = self._ends[s]
        return _decode(self.files[s], j, self._bufs[s][int(e_[j]) : int(e_[j + 1])])

    @overload
    def __getitem__(self, i: int) -> dict: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(self._n))]
        i = int(i)  # numpy integers too (operator.index semantics)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"chunk row {i} out of range ({self._n} chunks)")
        return self._row(i)

    def __iter__(self) -> Iterator[dict]:
        for s, f in enumerate(self.files):
            buf, e_ = self._bufs[s], self._ends[s]
            for j in range(len(e_) - 1):
                yield _decode(f, j, buf[int(e_[j]) : int(e_[j + 1])])

    def row_of(self, chunk_id: str) -> int | None:
        if not isinstance(chunk_id, str):
            return None
        h = np.uint64(id_hash(chunk_id))
        a, b = np.searchsorted(self._sorted, h, side="left"), np.searchsorted(self._sorted, h, side="right")
        hit = None
        for r in self._order[a:b]:  # ascending rows (stable sort): the last match wins, as the eager dict
            if self._row(int(r)).get("chunk_id") == chunk_id:
                hit = int(r)
        return hit

    def shard_lengths(self) -> list[int]:
        """The number of lines of each file, in order."""
        return [len(e) - 1 for e in self._ends]

    def resident_bytes(self) -> int:
        """The bytes this object holds in its arrays (the mapped file pages are the OS page cache's)."""
        return int(sum(e.nbytes for e in self._ends) + self._order.nbytes + self._sorted.nbytes + self._first.nbytes)


class ChunkTexts(Sequence[str]):
    """`chunks[i]["text"]` on access: the texts of the chunks for a store that reads some (RecomputeStore)."""

    def __init__(self, chunks: Sequence[dict]):
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [c["text"] for c in self.chunks[i]]
        return self.chunks[i]["text"]


def eager_chunks(files: Sequence[str | Path]) -> tuple[list[dict], dict[str, int]]:
    """The reference: every line of every file decoded into a list, and {chunk_id: row} (the form
    load_sharded held before MappedChunks; a single bundle still loads its chunks this way)."""
    chunks: list[dict] = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                chunks += [json.loads(line) for line in fh]
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError(f"{f}: unreadable: {e}") from e
    return chunks, {c["chunk_id"]: i for i, c in enumerate(chunks)}
