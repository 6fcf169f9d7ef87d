"""Bundles in object storage (S3, GCS, any fsspec file system): each process downloads the part of a
bundle it opens into a node-local cache, verified against the manifest's checksums, and opens it there.

- `localize(location)`: a local directory as it is; a URI (`s3://bucket/kb`) becomes the node-local
  copy of the files the serving process opens: the manifest and, of a sharded bundle, each shard's
  metadata (`replica_files`); of an unsharded bundle, every file. The copy records its source
  (`source.json`), and `shard_specs` then names each shard by its URI, so a shard (in this process or
  in a Ray actor on another node) downloads its own directory and no node holds what it never opens.
- `fetch(uri, shard=...)`: one shard's directory, the same way.
- `push(directory, uri)`: upload a bundle, its manifests last, so a reader that finds a manifest
  finds every file it lists.

The cache (`SOFTKNN_CACHE_DIR`, default ~/.cache/softknn/bundles) is keyed by the bundle's version id:
a rebuilt bundle is a new directory, never an overwrite; each folder keeps the versions opened
last (`evict`, SOFTKNN_CACHE_KEEP). Each file is downloaded to a temporary name,
hashed while it streams, fsynced and renamed into place; a file of the wrong sha256 is deleted and
refused (BundleError naming it). A file already in the cache at its recorded size is kept: the loader
checks the sha256 of every file it opens (load_bundle's `verify`, a shard's own), so a cached copy
damaged since is refused there. One lock file per version serialises the processes of one node
(a replica and its shard actors) fetching the same files. Credentials and endpoints come from the
file system's own configuration (for S3: the AWS_* environment, AWS_ENDPOINT_URL for MinIO and
other S3-compatible stores); fsspec and the protocol's package (s3fs, gcsfs) must be installed.

What a location is (`Location`, `is_remote`) is softknn.common.location, re-exported here: the
settings and `softknn serve` read it before numpy, torch or FAISS load.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from softknn.common.errors import BundleError
from softknn.common.file_lock import exclusive_lock
from softknn.common.location import URI, URI_PATTERN, Location, RemoteURI, is_remote  # noqa: F401 (re-exported)
from softknn.storage.layout import (
    FORMAT_VERSION,
    MANIFEST,
    atomic_write_bytes,
    data_files,
    fsync_dir,
    read_manifest,
    replica_files,
    verify_bundle,
    version_id,
)
from softknn.storage.manifest import Manifest

SOURCE = "source.json"  # in a cached copy: the URI it came from (not part of the bundle; not checksummed)
CACHE_ENV = "SOFTKNN_CACHE_DIR"
KEEP_ENV, DEFAULT_KEEP = "SOFTKNN_CACHE_KEEP", 3
VERSION = re.compile(r"[0-9a-f]{16}")  # a version id (softknn.storage.layout.version_id): a cache folder's name
CHUNK = 1 << 22


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "softknn" / "bundles")


def _fs(uri: str):
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - fsspec comes with the `remote` extra
        raise BundleError(f"{uri}: reading bundles from object storage needs fsspec (pip install 'softknn[remote]')") from e
    try:
        return fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as e:
        raise BundleError(f"{uri}: no file system for this URI ({e}); for s3:// install s3fs, for gs:// gcsfs") from e


def _join(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def read_remote_manifest(uri: str) -> dict:
    """The manifest of the bundle at `uri`, checked as read_manifest checks a local one."""

    fs, root = _fs(uri)
    try:
        data = fs.cat_file(_join(root, MANIFEST))
    except FileNotFoundError as e:
        raise BundleError(f"{uri}: not a bundle (no {MANIFEST})") from e
    except Exception as e:  # noqa: BLE001 - network, credentials: the store's own message
        raise BundleError(f"{uri}: cannot read {MANIFEST}: {type(e).__name__}: {e}") from e
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{_join(uri, MANIFEST)}: unreadable manifest: {e}") from e
    if raw.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{_join(uri, MANIFEST)}: format_version {raw.get('format_version')!r}, "
                          f"this softknn reads {FORMAT_VERSION}")
    return raw


def holds_bundle(uri: str) -> bool:
    """Whether `uri` holds a bundle's top manifest (what `push` writes last)."""

    fs, root = _fs(uri)
    try:
        return bool(fs.exists(_join(root, MANIFEST)))
    except Exception as e:  # noqa: BLE001 - network, credentials: the store's own message
        raise BundleError(f"{uri}: cannot read: {type(e).__name__}: {e}") from e


def staging_dir() -> Path:
    """A new empty folder beside the node-local cache, for a bundle built here to be pushed (the
    caller removes it); never named like a cached version, so eviction leaves it alone."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".build-", dir=root))


def read_location_manifest(location: str | Path) -> dict:

    return read_remote_manifest(str(location)) if is_remote(location) else read_manifest(Path(location))


def replica_names(m) -> list[str]:
    """What a serving process opens of the bundle with manifest `m` (softknn.storage.manifest.Manifest)."""

    if m.sharded:
        return replica_files(m)
    gen = m.generator.memory if m.generator is not None else None
    return list(data_files(m.memory, m.lexical is not None, gen))


def _download(fs, src: str, dst: Path, want_bytes: int, want_sha: str | None, uri: str) -> None:
    """src → dst through a temporary file, hashed as it streams; refuse a wrong size or sha256."""

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.part-{os.getpid()}")
    h, n = hashlib.sha256(), 0
    try:
        with fs.open(src, "rb") as r, open(tmp, "wb") as w:
            while block := r.read(CHUNK):
                h.update(block)
                w.write(block)
                n += len(block)
            w.flush()
            os.fsync(w.fileno())
        if n != want_bytes:
            raise BundleError(f"{uri}: size {n} != manifest {want_bytes} (incomplete upload?)")
        if want_sha is not None and h.hexdigest() != want_sha:
            raise BundleError(f"{uri}: sha256 mismatch (corrupt or modified in the store)")
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except FileNotFoundError as e:
        raise BundleError(f"{uri}: missing from the store") from e
    finally:
        tmp.unlink(missing_ok=True)


def _lock_path(local: Path) -> Path:
    return local.parent / f".{local.name}.lock"


def cache_keep() -> int:
    """How many versions a cache folder keeps (SOFTKNN_CACHE_KEEP, default 3; 0 = all)."""
    return int(os.environ.get(KEEP_ENV) or DEFAULT_KEEP)


def evict(folder: Path, keep: int, current: Path) -> list[Path]:
    """Remove the least recently opened versions in `folder` beyond the `keep` newest (never
    `current`, nor one whose lock another process holds: it is being fetched); the ones removed.
    A process serving a removed version keeps its open and memory-mapped files (POSIX unlinks them
    when the last map goes); a later open fetches it again."""
    if keep <= 0:
        return []
    others = sorted((d for d in folder.iterdir() if d.is_dir() and VERSION.fullmatch(d.name) and d != current),
                    key=lambda d: d.stat().st_mtime_ns, reverse=True)  # newest first; `current` counts as the newest
    removed = []
    for d in others[keep - 1:]:
        with open(_lock_path(d), "a+b") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            try:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    return removed


def _materialize(uri: str, names: list[str], raw: dict, local: Path) -> None:
    """Download each of `names` (checksummed in manifest `raw`) not yet in `local`, the manifest
    last; mark `local` as just opened and evict the folder's least recently opened versions."""

    files = raw.get("files") or {}
    fs, root = _fs(uri)
    with exclusive_lock(_lock_path(local)):
        for name in names:
            rec = files.get(name)
            if rec is None:
                raise BundleError(f"{_join(uri, MANIFEST)}: no checksum recorded for {name}")
            dst = local / name
            if dst.is_file() and dst.stat().st_size == rec["bytes"]:
                continue  # fetched before (the loader checks its sha256)
            _download(fs, _join(root, name), dst, rec["bytes"], rec.get("sha256"), _join(uri, name))
        if not (local / MANIFEST).is_file():
            atomic_write_bytes(local / MANIFEST, json.dumps(raw, indent=2).encode())
        if not (local / SOURCE).is_file():
            atomic_write_bytes(local / SOURCE, json.dumps({"uri": uri}).encode())
        os.utime(local)  # the recency evict() orders by
    evict(local.parent, cache_keep(), local)


def _checked_manifest(uri: str):
    """The manifest at `uri`, raw and typed, its version_id the hash of its content (it names a cache folder)."""

    raw = read_remote_manifest(uri)
    m = Manifest.of(raw, _join(uri, "manifest.json"))
    if version_id(raw) != m.version_id or not VERSION.fullmatch(m.version_id):
        raise BundleError(f"{_join(uri, 'manifest.json')}: version_id does not match its content (edited manifest)")
    return raw, m


def localize(location: str | Path, cache: Path | None = None) -> Path:
    """`location` as a local directory: a local path as it is; a URI fetched (the serving part)."""
    if not is_remote(location):
        return Path(location)

    uri = str(location).rstrip("/")
    raw, m = _checked_manifest(uri)
    local = (cache or cache_root()) / m.version_id
    _materialize(uri, replica_names(m), raw, local)
    return local


def fetch(uri: str, cache: Path | None = None) -> Path:
    """A shard directory's URI (`…/kb/shard-0001`) as a node-local directory with all its files."""

    uri = uri.rstrip("/")
    raw, m = _checked_manifest(uri)
    # a shard's manifest lists its own files; the directory is keyed by the shard's version id
    names = list(data_files(m.memory, m.lexical is not None))
    local = (cache or cache_root()) / "shards" / m.version_id
    _materialize(uri, names, raw, local)
    return local


def source_of(directory: Path) -> str | None:
    """The URI a cached copy came from (localize wrote it), or None for a bundle built here."""
    p = Path(directory) / SOURCE
    if not p.is_file():
        return None
    return str(json.loads(p.read_text())["uri"])


def push(directory: Path, uri: str) -> int:
    """Upload the bundle in `directory` to `uri` (every file the manifests list, then the shard
    manifests, then the top manifest); the number of files uploaded. Refuses an unverified bundle."""

    directory = Path(directory)
    raw = verify_bundle(directory)
    m = Manifest.of(raw, directory / MANIFEST)
    fs, root = _fs(uri)
    names = sorted(m.files)
    last = [n for n in names if n.endswith("/" + MANIFEST)]
    for name in [n for n in names if n not in last] + last + [MANIFEST]:
        dst = _join(root, name)
        try:
            fs.put_file(str(directory / name), dst)
        except Exception as e:  # noqa: BLE001
            raise BundleError(f"{_join(uri, name)}: upload failed: {type(e).__name__}: {e}") from e
        size = fs.info(dst)["size"]
        if size != (directory / name).stat().st_size:
            raise BundleError(f"{_join(uri, name)}: {size} bytes in the store after upload, "
                              f"{(directory / name).stat().st_size} here")
    return len(names) + 1
