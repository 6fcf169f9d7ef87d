"""The index bundle as softknn opens and writes it: load (verified, plain or sharded), finalize, recalibrate.
Nothing is unpickled.

Its files, their checksums and the reading of one plain bundle directory are softknn.storage.layout's
(the directory's contents are listed there); a sharded bundle (`--shards N`, softknn.storage.shards) is a
manifest over N such bundles in shard-NNNN/. This module imports layout, manifest and shards, and
none of them imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

from softknn.common.errors import BundleError
from softknn.storage.layout import (
    FORMAT_VERSION,
    MANIFEST,
    Bundle,
    atomic_write_bytes,
    check_versions,
    data_files,
    fsync_dir,
    open_bundle,
    read_manifest,
    record_files,
    replica_files,
    sha256_file,
    verify_bundle,
    verify_files,
    version_id,
)
from softknn.storage.manifest import Manifest
from softknn.storage.shards import load_sharded


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


def load_bundle(
    path: Path, *, expected_fingerprint: str | None = None, verify: bool = True, use_gpu: bool = False,
    shard_backend=None,
) -> Bundle:
    """Verify (checksums) and load a bundle; refuse one built with other model weights.

    `verify`: the manifest (its version_id, and a sharded bundle's shard manifests) and the size and
    sha256 of every file this process opens, once. Of a sharded bundle that is the metadata the
    serving process keeps (per shard: manifest, chunks, chunk token ranges, token spans, lexical
    index; softknn.storage.layout.replica_files); each shard checks its own bulk files where it opens them
    (softknn.storage.shards.Shard: embeddings, FAISS index, memory), in this process or in its Ray actor.

    A sharded bundle loads as a softknn.storage.shards.ShardedBundle (the same interface), its shards in
    this process or, with `shard_backend` (softknn.storage.ray_shards.RayShards.factory(...)), elsewhere.
    The one place the chunk search (softknn.model.backends.ChunkSearch) is chosen: the manifest's index
    in a ChunkIndex, or the shards' merge; the memory store is load_memory's choice."""
    path = Path(path)
    raw = read_manifest(path)
    manifest = Manifest.of(raw, path / MANIFEST)
    if verify:  # the files this process opens, each once; a sharded bundle's shards check their own
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
        return load_sharded(path, manifest, backend_factory=shard_backend, use_gpu=use_gpu, verify=verify)  # type: ignore[return-value]  # ShardedBundle stands in for Bundle (duck-typed)
    return open_bundle(path, manifest, use_gpu=use_gpu)
