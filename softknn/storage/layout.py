"""The on-disk bundle, below every module that reads or writes one: file names, checksums, atomic
writes, the manifest read and verified, and one plain (unsharded) bundle directory opened.

bundle.py (load, finalize), shards.py (a shard is a plain bundle; the sharded layout's files) and
remote.py (what a node fetches and checks) share these, so the three import this module and not
each other: layout and manifest at the bottom, then remote, then shards, then bundle.

A bundle is one directory:
    manifest.json      format version, model + weight fingerprint, layer, index spec, counts,
                       labels, build settings, created-at, sha256 and size of every other file
    embeddings.npy     (N, D) float32 chunk embeddings e_c (the exact search and PQ re-ranking)
    index.faiss        FAISS index over embeddings.npy
    mem_hidden.npy     (Ntok, C) float32 layer-L input hidden states of every chunk's non-special
                       tokens (the default memory `hidden`: K/V are projected from them at query
                       time); the manifest's `memory` names the representation and its files
                       (softknn.storage.memory_stores), e.g. `kv`: kv_keys.npy and kv_values.npy
                       (Ntok, nh, hs), the keys and values themselves
    chunk_tokens.npy   (N, 2) int64: first memory row and token count of each chunk
    token_spans.npy    (Ntok, 2) int64: each memory token's char span in its document
    chunks.jsonl       per chunk: chunk_id, doc_id, text, start, end (char span), label, metadata
    lexical/           the BM25 index of the chunks (softknn.retrieval.lexical; bm25s's files, no pickles);
                       optional: a bundle without it (built before it existed) serves dense-only
    generator/         the generator's memory, with a generator (softknn.generate.memory: its files below)

A sharded bundle (`--shards N`, softknn.storage.shards) is a manifest over N such bundles in shard-NNNN/.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from softknn.common.errors import BundleError
from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec
from softknn.retrieval.lexical import LEXICAL_FILES, LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import default_mode
from softknn.storage.manifest import Manifest
from softknn.storage.memory_stores import (
    DEFAULT_MEMORY,
    MEMORY_FILES,
    MemoryStore,
    load_memory,
    memory_files,
    memory_summary,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CORE_FILES = ("embeddings.npy", "index.faiss", "chunk_tokens.npy", "token_spans.npy", "chunks.jsonl")
DATA_FILES = CORE_FILES[:2] + MEMORY_FILES[DEFAULT_MEMORY] + CORE_FILES[2:]  # a bundle of the default memory `hidden`
GEN_DIR = "generator"  # the generator memory's folder (softknn.generate.memory writes and reads it)
GEN_MEMORY_KINDS = ("fp32", "fp16", "int8", "q4", "q2", "recompute")
BITS = {"q4": 4, "q2": 2}  # the quantised kinds' bits per code: their files carry ranges
SHARD_DIR = "shard-{:04d}"


def data_files(memory: str, lexical: bool = False, generator: str | None = None,
               generator_selects: bool = False) -> tuple[str, ...]:
    """Every file a bundle must hold: the core files, its memory's, the lexical index's if it has one,
    and the generator memory's (of that kind, with its token selection) if it has one."""
    return (CORE_FILES[:2] + memory_files(memory) + CORE_FILES[2:] + (LEXICAL_FILES if lexical else ())
            + generator_files(generator, generator_selects))


def record_files(manifest: dict) -> tuple[str, ...]:
    """data_files of a manifest being written (a dict: the builder's record, before it is typed)."""
    gen = manifest.get("generator")
    return data_files(manifest.get("memory", "kv"), bool(manifest.get("lexical")), gen["memory"] if gen else None,
                      bool(gen and gen.get("keep", 1.0) < 1.0))


def sha256_file(path: Path, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(bufsize):
            h.update(buf)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name beside `path`, fsync, then os.replace: readers see old or new."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _PlainWriter:
    """A file seen through write() alone, so numpy streams an array in chunks through Python's write.

    numpy's fast path for real files (ndarray.tofile) loses errno on a full disk ("problem writing
    element N"); Python's write raises OSError with it (ENOSPC, EDQUOT, EROFS), which the builder
    turns into a message that names the folder (tests/reliability/test_crash_build.py)."""

    def __init__(self, f):
        self.write = f.write


def save_array(path: Path, array: np.ndarray) -> None:
    """Write `array` as the .npy `path` through Python's write, so a full disk, a quota or a
    read-only folder raises OSError with its errno (see _PlainWriter): every array of a bundle,
    its shards and its sub-bundles is written by it."""
    with open(path, "wb") as f:
        np.lib.format.write_array(_PlainWriter(f), np.ascontiguousarray(array), allow_pickle=False)


def allocated_memmap(path: Path, dtype, shape: tuple[int, ...]) -> np.memmap:
    """A new .npy memory map whose blocks are allocated up front.

    numpy's open_memmap makes a sparse file; writing through the map into a full disk then kills the
    process with SIGBUS (seen on a full tmpfs) instead of raising. posix_fallocate raises ENOSPC here.
    """
    arr = np.lib.format.open_memmap(path, "w+", dtype, shape)
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    return arr


def version_id(manifest: dict) -> str:
    """Content address: sha256 of the manifest without its own id and creation time."""
    body = {k: v for k, v in manifest.items() if k not in ("version_id", "created_at")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def generator_files(kind: str | None, selected: bool = False) -> tuple[str, ...]:
    """The files a bundle's generator memory of `kind` holds (none without a generator)."""
    if kind is None:
        return ()
    if kind not in GEN_MEMORY_KINDS:
        raise ValueError(f"generator memory must be one of {GEN_MEMORY_KINDS}, not {kind!r}")
    files = [f"{GEN_DIR}/tokens.npy", f"{GEN_DIR}/offsets.npy"]
    if kind != "recompute":
        files.append(f"{GEN_DIR}/kv.npy")
    if kind == "int8":
        files.append(f"{GEN_DIR}/kv_scale.npy")
    if kind in BITS:
        files += [f"{GEN_DIR}/k_range.npy", f"{GEN_DIR}/v_range.npy"]
    if selected and kind != "recompute":
        files += [f"{GEN_DIR}/kept.npy", f"{GEN_DIR}/kv_offsets.npy"]
    return tuple(files)


def shard_files(dirs: Manifest | list[str], memory: str = "kv", lexical: bool = False) -> list[str]:
    """Every file a sharded bundle must hold, relative to its directory (shard manifests included):
    of a typed manifest, or of the shard dirs, memory kind and lexical flag of one being written."""
    if isinstance(dirs, Manifest):
        names, memory, lexical = [sh.dir for sh in dirs.shards or ()], dirs.memory, dirs.lexical is not None
    else:
        names = dirs
    out = []
    for d in names:
        out.append(f"{d}/{MANIFEST}")
        out += [f"{d}/{name}" for name in data_files(memory, lexical)]
    return out


def shard_own_files(memory: str) -> tuple[str, ...]:
    """The files of a shard directory only the shard opens (and checks): its index, embeddings and memory."""
    return ("embeddings.npy", "index.faiss", *memory_files(memory))


def replica_files(m: Manifest) -> list[str]:
    """The files of a sharded bundle the serving process opens (and checks): every shard's manifest,
    chunks, chunk token ranges, token spans and lexical index; the rest are the shards' own."""
    own = set(shard_own_files(m.memory))
    return [name for name in shard_files(m) if name.split("/", 1)[1] not in own]


def fsync_dir(path: Path) -> None:
    """fsync a directory: the renames and creations in it survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path) -> dict:
    mpath = Path(path) / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{path}: not a bundle (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{mpath}: unreadable manifest: {e}") from e
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{mpath}: format_version {manifest.get('format_version')!r}, this softknn reads {FORMAT_VERSION}"
        )
    return manifest


def verify_bundle(path: Path) -> dict:
    """Check the manifest (its fields, softknn.storage.manifest) and every file's size and sha256; return
    the manifest as written (the dict its version_id hashes) or raise BundleError. `softknn verify`;
    loading checks only the files the loading process opens (`load_bundle`, softknn.storage.shards)."""
    path = Path(path)
    raw = read_manifest(path)
    m = Manifest.of(raw, path / MANIFEST)
    gen = m.generator.memory if m.generator is not None else None
    selects = m.generator is not None and m.generator.keep < 1.0
    verify_files(path, m, shard_files(m) if m.sharded else data_files(m.memory, m.lexical is not None, gen, selects))
    check_versions(path, raw, m)
    return raw


def verify_files(path: Path, m: Manifest, names) -> None:
    """Size and sha256 of each of `names` (relative to the bundle `path`) against manifest `m`."""
    for name in names:
        f = m.files.get(name)
        if f is None:
            raise BundleError(f"{path / MANIFEST}: no checksum recorded for {name}")
        p = path / name
        if not p.is_file():
            raise BundleError(f"{p}: missing")
        if p.stat().st_size != f.bytes:
            raise BundleError(f"{p}: size {p.stat().st_size} != manifest {f.bytes}")
        if sha256_file(p) != f.sha256:
            raise BundleError(f"{p}: sha256 mismatch (corrupt or modified)")


def check_versions(path: Path, raw: dict, m: Manifest) -> None:
    """The manifest's version_id is its content's, and (sharded) each shard manifest's is the one listed."""
    if version_id(raw) != m.version_id:
        raise BundleError(f"{path / MANIFEST}: version_id does not match its content (edited manifest)")
    for sh in m.shards or ():
        sub = read_manifest(path / sh.dir)
        if sub.get("version_id") != sh.version_id or version_id(sub) != sh.version_id:
            raise BundleError(f"{path / sh.dir / MANIFEST}: version {sub.get('version_id')}, "
                              f"the bundle's manifest says {sh.version_id}")


@dataclass
class Bundle:
    path: Path
    manifest: Manifest
    index: ChunkIndex
    kv: MemoryStore  # the memory layer's K/V source, whatever the representation (softknn.storage.memory_stores)
    chunks: list[dict]
    token_spans: np.ndarray  # (Ntok, 2)
    labels: list[str] = field(default_factory=list)
    lexical: LexicalIndex | None = None  # None: a bundle built without one serves dense-only
    _by_id: dict[str, int] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.manifest.version_id

    @property
    def memory_layer(self) -> int:
        return self.manifest.memory_layer

    def __len__(self) -> int:
        return len(self.chunks)

    def row_of(self, chunk_id: str) -> int | None:
        return self._by_id.get(chunk_id)

    def summary(self) -> dict:
        return bundle_summary(self.path, self.manifest)


def bundle_summary(path: Path, m: Manifest) -> dict:
    """What /v1/index says of a bundle (sharded or not): the manifest's sections as written."""
    raw = m.raw
    out = {
        "version_id": m.version_id,
        "path": str(path),
        "created_at": m.created_at,
        "model": raw["model"],
        "memory_layer": m.memory_layer,
        "index": raw["index"],
        "kv_dtype": m.kv_dtype,
        "memory": memory_summary(m),
        "counts": raw["counts"],
        "labels": m.labels,
        "calibration": raw.get("calibration") or {},
        "lexical": lexical_summary(m),
        "generator": _generator_summary(raw.get("generator")),
        "bytes": sum(f.bytes for f in m.files.values()),
    }
    return out  # a sharded bundle's shards are in its manifest (`softknn info`); the API shape stays the same


def _generator_summary(rec: dict | None) -> dict | None:
    """The generator memory's record without its token lists (the prefix) and the calibration's examples."""
    if rec is None:
        return None
    out = {k: v for k, v in rec.items() if k != "prefix"}
    if isinstance(out.get("calibration"), dict):
        out["calibration"] = {k: v for k, v in out["calibration"].items() if k != "examples"}
    return out


def lexical_summary(m: Manifest) -> dict:
    """What /v1/index and `softknn info` say of the lexical index, and the retrieval it enables."""
    lex = m.lexical
    if lex is None:
        return {"available": False, "default_retrieval": "dense",
                "note": "built without a lexical index: serves dense retrieval only "
                        "(rebuild, or `softknn add-lexical DIR`, for hybrid and lexical)"}
    lexical_bytes = sum(f.bytes for name, f in m.files.items() if name.endswith(LEXICAL_FILES))
    return {"available": True, "default_retrieval": default_mode(True, m.calibration.retrieval_defaults),
            "settings": lex.settings,
            "vocabulary": lex.vocabulary, "postings": lex.postings, "bytes": lexical_bytes,
            "bytes_per_chunk": round(lexical_bytes / max(1, m.counts.chunks), 1)}


def load_npy(path: Path) -> np.ndarray:
    """Memory-map one plain numeric .npy. Never unpickles: an object array (the only kind that
    holds a pickle) is refused with BundleError, before any of its bytes are interpreted."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:  # object dtype ("cannot be memory-mapped"/"allow_pickle=False"), bad header
        raise BundleError(f"{path}: not a plain numeric array ({e}); a bundle never holds pickled objects") from e


def open_bundle(path: Path, manifest: Manifest | None = None, *, use_gpu: bool = False) -> Bundle:
    """Open the plain (unsharded) bundle at `path` (its manifest read here when not given), its files
    as they are: load_bundle checks them first, a shard (softknn.storage.shards.Shard) checks its own."""
    import faiss

    path = Path(path)
    if manifest is None:
        manifest = Manifest.of(read_manifest(path), path / MANIFEST)
    load = lambda name: load_npy(path / name)  # noqa: E731
    xb = load("embeddings.npy")
    try:
        index = faiss.read_index(str(path / "index.faiss"))
    except RuntimeError as e:
        raise BundleError(f"{path / 'index.faiss'}: not a FAISS index ({str(e).strip().splitlines()[-1]})") from e
    ct = np.asarray(load("chunk_tokens.npy"))
    try:
        with open(path / "chunks.jsonl", encoding="utf-8") as f:
            chunks = [json.loads(line) for line in f]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path / 'chunks.jsonl'}: unreadable: {e}") from e
    kv = load_memory(path, manifest, load, ct, [c["text"] for c in chunks])
    n = manifest.counts.chunks
    if not (len(chunks) == n == xb.shape[0] == index.ntotal == len(ct)):
        raise BundleError(f"{path}: inconsistent chunk counts (manifest {n}, chunks {len(chunks)}, index {index.ntotal})")
    spec = IndexSpec(manifest.index.kind, manifest.index.params, manifest.index.reason)
    lexical = None
    if manifest.lexical is not None:
        lexical = LexicalIndex.load(path, LexicalSpec.from_manifest(manifest.lexical.settings))
        if len(lexical) != n:
            raise BundleError(f"{path}: lexical index has {len(lexical)} chunks, the manifest {n}")
    return Bundle(
        path=path,
        manifest=manifest,
        index=ChunkIndex(index, xb, spec, use_gpu=use_gpu),
        kv=kv,
        chunks=chunks,
        token_spans=load("token_spans.npy"),
        labels=list(manifest.labels),
        lexical=lexical,
        _by_id={c["chunk_id"]: i for i, c in enumerate(chunks)},
    )
