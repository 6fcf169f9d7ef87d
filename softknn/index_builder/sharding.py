"""The builder's side of sharded bundles (softknn.storage.shards reads them): split the assembled one-index
files into finalized sub-bundles, then checksum and finalize the whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from softknn.storage.layout import SHARD_DIR, shard_files
from softknn.storage.memory_stores import INT8_SCALE, memory_files
from softknn.storage.shards import shard_ranges, slice_lexical


def write_shards(full: Path, tmp: Path, manifest: dict, lex, n_shards: int, *, write_memory=None) -> dict:
    """Split the assembled one-index bundle files in `full` into `n_shards` finalized sub-bundles under
    `tmp`; returns the top-level manifest (without files/version: `finalize_sharded` adds them).

    `write_memory(folder, lo, hi)`: writes the memory files of chunk rows [lo, hi) into a shard's
    folder (the builder's, from its encoded batches: then `full` holds no memory files). None: the
    memory is sliced from `full`'s one-index files (the plain form; the two give the same bytes,
    tests/shards/test_build.py)."""
    import faiss

    from softknn.retrieval.chunk_index import IndexSpec, build_index
    from softknn.storage.bundle import finalize
    from softknn.storage.layout import MANIFEST, save_array

    n = manifest["counts"]["chunks"]
    xb = np.load(full / "embeddings.npy", mmap_mode="r")
    kind = manifest.get("memory", "kv")
    # the memory's per-token arrays, sliced by token range; hidden-int8's scale is the whole KB's
    # per-channel one, written into every shard, so a shard's rows dequantise as the one-index bundle's
    per_token = [name for name in memory_files(kind) if name != INT8_SCALE]
    memory = {} if write_memory is not None else {name: np.load(full / name, mmap_mode="r") for name in per_token}
    spans = np.load(full / "token_spans.npy", mmap_mode="r")
    ct = np.load(full / "chunk_tokens.npy")
    with open(full / "chunks.jsonl", encoding="utf-8") as f:
        lines = f.readlines()
    spec = IndexSpec(manifest["index"]["kind"], manifest["index"]["params"], manifest["index"].get("reason", ""))
    entries = []
    for s, (lo, hi) in enumerate(shard_ranges(n, n_shards)):
        t0 = int(ct[lo, 0])
        t1 = int(ct[hi - 1, 0] + ct[hi - 1, 1])
        part = tmp / f".{SHARD_DIR.format(s)}.tmp"
        part.mkdir()
        x = np.ascontiguousarray(xb[lo:hi])
        save_array(part / "embeddings.npy", x)
        if write_memory is not None:
            write_memory(part, lo, hi)
        for name, arr in memory.items():
            save_array(part / name, arr[t0:t1])
        if INT8_SCALE in memory_files(kind):
            save_array(part / INT8_SCALE, np.load(full / INT8_SCALE))
        save_array(part / "token_spans.npy", spans[t0:t1])
        save_array(part / "chunk_tokens.npy", np.stack([ct[lo:hi, 0] - t0, ct[lo:hi, 1]], axis=1))
        (part / "index.faiss").write_bytes(faiss.serialize_index(build_index(x, spec)).tobytes())
        with open(part / "chunks.jsonl", "w", encoding="utf-8") as f:
            f.writelines(lines[lo:hi])
        sub = {k: v for k, v in manifest.items() if k not in ("calibration", "files", "version_id", "created_at")}
        sub["counts"] = dict(manifest["counts"], chunks=hi - lo, tokens=t1 - t0)
        sub["shard"] = {"index": s, "of": n_shards, "rows": [lo, hi], "tokens": [t0, t1]}
        sub["created_at"] = None  # the top manifest's is the bundle's: same input, same shard manifests (bytes)
        if lex is not None:
            r = slice_lexical(lex, lo, hi)
            r.save(part / "lexical", show_progress=False)
            sub["lexical"] = dict(manifest["lexical"], statistics="global",
                                  postings=int(r.scores["indptr"][-1]))
        sm = finalize(part, tmp / SHARD_DIR.format(s), sub)
        entries.append({"dir": SHARD_DIR.format(s), "rows": [lo, hi], "tokens": [t0, t1],
                        "version_id": sm["version_id"]})
        assert (tmp / SHARD_DIR.format(s) / MANIFEST).is_file()
    return dict(manifest, layout="sharded", shards=entries)


def finalize_sharded(tmp_dir: Path, out: Path, manifest: dict, *, force: bool = False) -> dict:
    """`softknn.storage.bundle.finalize` for a sharded bundle: checksum every shard file, write the top
    manifest (one version_id over all shards), rename into place (the old bundle kept until then)."""
    from softknn.storage.bundle import finalize

    names = shard_files([sh["dir"] for sh in manifest["shards"]], manifest.get("memory", "kv"), bool(manifest.get("lexical")))
    return finalize(tmp_dir, out, manifest, force=force, names=names)
