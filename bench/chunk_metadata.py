"""A replica's chunk metadata: the eager list of dicts vs the memory-mapped MappedChunks (issue 24 item 7).

Every replica of a sharded service opens the whole KB's chunk metadata (softknn.storage.shards.load_sharded).
Eager (softknn.storage.chunks.eager_chunks, what it held before): every chunks.jsonl line decoded into
a dict, plus {chunk_id: row}. Mapped (MappedChunks): the files memory-mapped, a line offset per
chunk and a sorted 8-byte id hash with its row; a row decoded when read.

    python -m bench chunk_metadata [--chunks 200000] [--shards 4] [--bundle DIR] [--calls 20000]

The lines are real: the chunks.jsonl of a sharded bundle (--bundle; default the sample KB built in 2
shards here, with the real encoder, cached under the bench cache), replicated to --chunks lines with
unique chunk_ids ("<id>#<copy>") into --shards files in a temporary directory: only the chunk
metadata, not a whole bundle (building a real 200k-chunk bundle is hours on CPU; the per-chunk cost
depends on the line, not on the KB's size). Reports, per arm: resident bytes per chunk (tracemalloc's
retained bytes after the load, and the process's anonymous RSS delta: a mapped file's pages are page
cache, not counted), load time, and µs per `chunks[row]` and per `row_of(id)` over random rows.
Writes bench/results/chunk_metadata.json and .png.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.common import plot_bars, write


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--chunks", type=int, default=200_000, help="lines of the synthesised metadata")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--bundle", type=Path, default=None, help="a sharded bundle whose chunks.jsonl lines to replicate")
    ap.add_argument("--calls", type=int, default=20_000, help="random chunks[row] and row_of calls per arm")


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def _source_lines(bundle: Path | None) -> list[bytes]:
    from bench.kb import CACHE
    from softknn.storage.layout import read_manifest

    if bundle is None:
        bundle = CACHE / "sample-2shards"
        if not (bundle / "manifest.json").exists():
            from softknn.common.console import sample_kb_path
            from softknn.index_builder.pipeline import BuildConfig, build_bundle
            from softknn.model.encoder import Encoder

            build_bundle(sample_kb_path(), bundle, BuildConfig(shards=2), Encoder(), progress=False)
    lines: list[bytes] = []
    for s in read_manifest(bundle)["shards"]:
        lines += (bundle / s["dir"] / "chunks.jsonl").read_bytes().splitlines()
    return lines


def _write_shards(lines: list[bytes], n: int, n_shards: int, out: Path) -> list[Path]:
    from softknn.storage.layout import SHARD_DIR
    from softknn.storage.shards import shard_ranges

    files = []
    for s, (lo, hi) in enumerate(shard_ranges(n, n_shards)):
        d = out / SHARD_DIR.format(s)
        d.mkdir(parents=True)
        with open(d / "chunks.jsonl", "wb") as f:
            for i in range(lo, hi):
                c = json.loads(lines[i % len(lines)])
                c["chunk_id"] = f"{c['chunk_id']}#{i // len(lines)}"
                f.write(json.dumps(c, ensure_ascii=False).encode() + b"\n")
        files.append(d / "chunks.jsonl")
    return files


def _arm(name: str, load, files: list[Path], calls: int, rng: random.Random) -> dict:
    gc.collect()
    rss0 = _rss_anon()
    tracemalloc.start()
    t0 = time.perf_counter()
    chunks, row_of = load(files)
    load_s = time.perf_counter() - t0
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = _rss_anon() - rss0
    n = len(chunks)
    rows = [rng.randrange(n) for _ in range(calls)]
    ids = [chunks[r]["chunk_id"] for r in rows]
    t0 = time.perf_counter()
    for r in rows:
        chunks[r]
    get_us = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    found = [row_of(i) for i in ids]
    row_of_us = (time.perf_counter() - t0) / calls * 1e6
    assert all(chunks[f]["chunk_id"] == i for f, i in zip(found, ids, strict=True))
    out = {"arm": name, "chunks": n, "load_s": round(load_s, 2),
           "tracemalloc_bytes_per_chunk": round(held / n, 1), "tracemalloc_peak_bytes_per_chunk": round(peak / n, 1),
           "rss_anon_bytes_per_chunk": round(rss / n, 1), "get_us": round(get_us, 2), "row_of_us": round(row_of_us, 2)}
    del chunks, row_of
    gc.collect()
    return out


def run(args: argparse.Namespace) -> dict:
    from softknn.storage.chunks import MappedChunks, eager_chunks

    lines = _source_lines(args.bundle)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="chunk-metadata-") as tmp:
        files = _write_shards(lines, args.chunks, args.shards, Path(tmp))
        disk = sum(f.stat().st_size for f in files)

        def mapped(fs):
            m = MappedChunks(fs)
            return m, m.row_of

        def eager(fs):
            chunks, by_id = eager_chunks(fs)
            return chunks, by_id.get

        rows = [_arm("mapped", mapped, files, args.calls, rng), _arm("eager", eager, files, args.calls, rng)]
    for r in rows:
        r["disk_bytes_per_chunk"] = round(disk / args.chunks, 1)
        print(json.dumps(r))
    plot_bars("chunk_metadata", [r["arm"] for r in rows], [r["tracemalloc_bytes_per_chunk"] for r in rows], None,
              "resident bytes per chunk (tracemalloc)", f"A replica's chunk metadata, {args.chunks:,} chunks")
    return write("chunk_metadata", {"command": args.command, "source_lines": len(lines), "rows": rows})
