"""The builder's encode cache: each chunk's model pass kept by the chunk's text, so a rebuild after a
KB update runs the model only over the chunks whose text is new (`softknn build --cache DIR`).

A chunk's encoding (its embedding, its memory rows, its tokens' char offsets) depends on its text,
the model and the memory settings only: not on the document it came from, its place or its id. The
cache keeps the builder's own encoded batches (`pipeline.encode_batch`'s arrays), each with the
sha256 of every chunk text it holds and each chunk's first char (the stored spans are document char
spans: a reused chunk's are shifted to its new place), under one folder per model and memory
setting (`DIR/<key>/`: the model's weight fingerprint and numerics, the memory layer, what is stored).

- A batch is written whole (a folder renamed into place), with the sha256 of each of its files. A
  build checks each batch it is about to use (its key file when the cache is opened: unused
  batches cost no read); one whose files do not match is removed and its chunks encoded again,
  never read.
- One build at a time per folder (an exclusive lock on `DIR/<key>/.lock`).
- After a build, batches of which it used no chunk are removed: the cache holds the newest build's
  chunks (plus the unused rows of batches it used in part).
- What a cached build writes equals a fresh build's chunks, spans, token counts, BM25 index and
  manifest counts exactly; its embeddings and memory rows equal a fresh build's up to the float
  round-off of padding a chunk with different neighbours in its batch (tests/builder/test_encode_cache.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from softknn.common.file_lock import exclusive_lock
from softknn.storage.layout import fsync_dir, save_array, sha256_file

log = logging.getLogger(__name__)

FORMAT = 1
SUMS = "sha256.json"


def chunk_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def stored_memory(memory: str, kv_dtype: str) -> str:
    """What encode_batch keeps of the memory for these settings: every hidden-* kind keeps float32
    states (quantised only when a bundle is assembled), so they share one cache."""
    if memory == "kv":
        return f"kv-{kv_dtype}"
    return "hidden-float32" if memory.startswith("hidden") else memory


def _keys(a: np.ndarray) -> list[bytes]:
    """A batch's keys.npy, (n, 32) uint8, as digests."""
    return [row.tobytes() for row in np.asarray(a, dtype=np.uint8).reshape(-1, 32)]


class EncodeCache:
    def __init__(self, root: Path, *, fingerprint: str, precision: str, layer: int, memory: str, kv_dtype: str):
        self.settings = {"format": FORMAT, "model_fingerprint": fingerprint, "precision": precision,
                         "memory_layer": layer, "stored": stored_memory(memory, kv_dtype)}
        key = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = Path(root) / key
        self.batches: list[Path] = []
        self.known: dict[bytes, tuple[int, int]] = {}  # chunk text sha256 -> (batch, position in it)
        self.removed = 0  # batches dropped for failing their checksums
        self._sums: list[dict[str, str]] = []  # per batch: file name -> sha256
        self._keys: list[list[bytes]] = []  # per batch: its chunk keys
        self._verified: set[int] = set()  # batches whose every file matched its sha256

    @contextlib.contextmanager
    def locked(self) -> Iterator[EncodeCache]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.dir / ".lock"):
            settings = self.dir / "settings.json"
            if not settings.is_file():
                settings.write_text(json.dumps(self.settings, indent=1, sort_keys=True) + "\n")
            for stale in self.dir.glob("*.tmp-*"):  # a killed build's half-written batch
                shutil.rmtree(stale, ignore_errors=True)
            self._index()
            yield self

    def _index(self) -> None:
        """The batches and the chunk keys they hold. Only each batch's key file is checked here; the rest
        of a batch is checked when a build is about to use it (`verify`)."""
        self.batches, self.known = [], {}
        self._sums, self._keys, self._verified = [], [], set()
        for d in sorted(self.dir.glob("batch-*")):
            try:
                sums = json.loads((d / SUMS).read_text())
                if sha256_file(d / "chunk_keys.npy") != sums.get("chunk_keys.npy"):
                    raise ValueError("chunk_keys.npy")
                keys = _keys(np.load(d / "chunk_keys.npy", allow_pickle=False))
            except (OSError, ValueError) as e:
                self._drop(d, str(e))
                continue
            self._add(d, sums, keys, verified=False)

    def _add(self, d: Path, sums: dict, keys: list[bytes], *, verified: bool) -> None:
        i = len(self.batches)
        self.batches.append(d)
        self._sums.append(sums)
        self._keys.append(keys)
        if verified:
            self._verified.add(i)
        for b, k in enumerate(keys):
            self.known.setdefault(k, (i, b))

    def _drop(self, d: Path, why: str) -> None:
        log.warning("encode cache: %s fails its checksums (%s): removed, its chunks are encoded again", d, why)
        shutil.rmtree(d, ignore_errors=True)
        self.removed += 1

    def verify(self, keys: list[bytes]) -> None:
        """Check every file of the batches that would give `keys` against its sha256 (each batch once);
        a batch that fails is removed and its chunks are taken from another batch or encoded again."""
        while True:
            need = sorted({self.known[k][0] for k in keys if k in self.known} - self._verified)
            if not need:
                return
            bad = set()
            for i in need:
                d = self.batches[i]
                try:
                    failed = [name for name, digest in self._sums[i].items() if sha256_file(d / name) != digest]
                except OSError as e:
                    failed = [str(e)]
                if failed:
                    self._drop(d, ", ".join(failed))
                    bad.add(i)
                else:
                    self._verified.add(i)
            if bad:
                self.known = {}
                for i, ks in enumerate(self._keys):
                    if i not in bad and self.batches[i].is_dir():
                        for b, k in enumerate(ks):
                            self.known.setdefault(k, (i, b))

    def write(self, keys: list[bytes], starts: list[int], arrays: dict[str, np.ndarray]) -> None:
        """One encoded batch (encode_batch's arrays for the chunks of `keys`, first chars `starts`)."""
        name = "batch-" + hashlib.sha256(b"".join(keys)).hexdigest()[:24]
        final = self.dir / name
        if final.is_dir():  # the same chunks in the same batch: already here
            return
        tmp = self.dir / f"{name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        files = {**arrays, "chunk_keys": np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 32),
                 "starts": np.asarray(starts, dtype=np.int64)}
        sums = {}
        for n, a in files.items():
            save_array(tmp / f"{n}.npy", a)
            with open(tmp / f"{n}.npy", "rb+") as f:
                os.fsync(f.fileno())
            sums[f"{n}.npy"] = sha256_file(tmp / f"{n}.npy")
        (tmp / SUMS).write_text(json.dumps(sums, sort_keys=True))
        os.replace(tmp, final)
        fsync_dir(self.dir)
        self._add(final, sums, list(keys), verified=True)

    def prune(self, used: set[bytes]) -> int:
        """Remove the batches holding none of `used`; returns how many."""
        n = 0
        for d, keys in zip(self.batches, self._keys, strict=True):
            if not d.is_dir():
                continue
            if not any(k in used for k in keys):
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n
