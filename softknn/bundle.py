"""The on-disk index bundle: manifest, checksums, atomic write, load + verify. Nothing is unpickled.

A bundle is one directory:
    manifest.json      format version, model + weight fingerprint, layer, index spec, counts,
                       labels, build settings, created-at, sha256 and size of every other file
    embeddings.npy     (N, D) float32 chunk embeddings e_c (the exact search and PQ re-ranking)
    index.faiss        FAISS index over embeddings.npy
    mem_hidden.npy     (Ntok, C) float32 layer-L input hidden states of every chunk's non-special
                       tokens (the default memory `hidden`: K/V are projected from them at query
                       time); the manifest's `memory` names the representation and its files
                       (softknn.memory_stores), e.g. `kv`: kv_keys.npy and kv_values.npy
                       (Ntok, nh, hs), the keys and values themselves
    chunk_tokens.npy   (N, 2) int64: first memory row and token count of each chunk
    token_spans.npy    (Ntok, 2) int64: each memory token's char span in its document
    chunks.jsonl       per chunk: chunk_id, doc_id, text, start, end (char span), label, metadata
    lexical/           the BM25 index of the chunks (softknn.retrieval.lexical; bm25s's files, no pickles);
                       optional: a bundle without it (built before it existed) serves dense-only

A sharded bundle (`--shards N`, softknn.shards) is a manifest over N such bundles in shard-NNNN/.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from softknn.common.errors import BundleError
from softknn.gen_memory import generator_files
from softknn.manifest import Manifest
from softknn.memory_stores import DEFAULT_MEMORY, MEMORY_FILES, MemoryStore, load_memory, memory_files, memory_summary
from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec
from softknn.retrieval.lexical import LEXICAL_FILES, LexicalIndex, LexicalSpec
from softknn.retrieval.scoring import default_mode

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CORE_FILES = ("embeddings.npy", "index.faiss", "chunk_tokens.npy", "token_spans.npy", "chunks.jsonl")
DATA_FILES = CORE_FILES[:2] + MEMORY_FILES[DEFAULT_MEMORY] + CORE_FILES[2:]  # a bundle of the default memory `hidden`


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


def version_id(manifest: dict) -> str:
    """Content address: sha256 of the manifest without its own id and creation time."""
    body = {k: v for k, v in manifest.items() if k not in ("version_id", "created_at")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def finalize(tmp_dir: Path, out: Path, manifest: dict, *, force: bool = False,
             names: list[str] | None = None) -> dict:
    """Checksum every data file in tmp_dir, write the manifest, and rename tmp_dir to out.

    If `out` exists it is refused unless `force`; then it is moved aside first and removed only
    after the new bundle is in place, so a crash leaves either the old or the new bundle.
    """
    files = {}
    for name in names if names is not None else record_files(manifest):
        p = tmp_dir / name
        if not p.is_file():
            raise BundleError(f"{p}: missing while finalizing the bundle")
        files[name] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    manifest = dict(manifest, format_version=FORMAT_VERSION, files=files)
    manifest.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds"))
    manifest["version_id"] = version_id(manifest)
    atomic_write_bytes(tmp_dir / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
    fsync_dir(tmp_dir)
    old = None
    if out.exists():
        if not force:
            raise BundleError(f"{out}: already exists; pass --force to replace it")
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    os.replace(tmp_dir, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return manifest


def write_calibration(bundle: Path, calibration: dict) -> dict:
    """Set the manifest's calibration section, recompute version_id, write manifest.json atomically.

    The bundle is verified first (checksums), so a corrupt bundle is never re-stamped.
    """
    bundle = Path(bundle)
    manifest = verify_bundle(bundle)
    manifest["calibration"] = calibration
    manifest["version_id"] = version_id(manifest)
    atomic_write_bytes(bundle / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
    return manifest


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
    """Check the manifest (its fields, softknn.manifest) and every file's size and sha256; return
    the manifest as written (the dict its version_id hashes) or raise BundleError. `softknn verify`;
    loading checks only the files the loading process opens (`load_bundle`, softknn.shards)."""
    path = Path(path)
    raw = read_manifest(path)
    m = Manifest.of(raw, path / MANIFEST)
    from softknn.shards import shard_files

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
    kv: MemoryStore  # the memory layer's K/V source, whatever the representation (softknn.memory_stores)
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
        "bytes": sum(f.bytes for f in m.files.values()),
    }
    return out  # a sharded bundle's shards are in its manifest (`softknn info`); the API shape stays the same


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


def load_bundle(
    path: Path, *, expected_fingerprint: str | None = None, verify: bool = True, use_gpu: bool = False,
    shard_backend=None,
) -> Bundle:
    """Verify (checksums) and load a bundle; refuse one built with other model weights.

    `verify`: the manifest (its version_id, and a sharded bundle's shard manifests) and the size and
    sha256 of every file this process opens, once. Of a sharded bundle that is the metadata the
    serving process keeps (per shard: manifest, chunks, chunk token ranges, token spans, lexical
    index; softknn.shards.replica_files); each shard checks its own bulk files where it opens them
    (softknn.shards.Shard: embeddings, FAISS index, memory), in this process or in its Ray actor.

    A sharded bundle loads as a softknn.shards.ShardedBundle (the same interface), its shards in
    this process or, with `shard_backend` (softknn.service.ray_serving.RayShards.factory(...)), elsewhere.
    The one place the chunk search (softknn.model.backends.ChunkSearch) is chosen: the manifest's index
    in a ChunkIndex, or the shards' merge; the memory store is load_memory's choice."""
    import faiss

    path = Path(path)
    raw = read_manifest(path)
    manifest = Manifest.of(raw, path / MANIFEST)
    if verify:  # the files this process opens, each once; a sharded bundle's shards check their own
        from softknn.shards import replica_files

        gen = manifest.generator.memory if manifest.generator is not None else None
        selects = manifest.generator is not None and manifest.generator.keep < 1.0
        verify_files(path, manifest, replica_files(manifest) if manifest.sharded
                     else data_files(manifest.memory, manifest.lexical is not None, gen, selects))
        check_versions(path, raw, manifest)
    fp = manifest.model.fingerprint
    if expected_fingerprint is not None and fp != expected_fingerprint:
        raise BundleError(
            f"{path}: built with model weights {fp[:12]}…, but the loaded model is {expected_fingerprint[:12]}…"
            f" ({manifest.model.name}); rebuild the bundle with this model"
        )
    if manifest.sharded:
        from softknn.shards import load_sharded

        return load_sharded(path, manifest, backend_factory=shard_backend, use_gpu=use_gpu, verify=verify)  # type: ignore[return-value]  # ShardedBundle stands in for Bundle (duck-typed)
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
