"""Builder throughput (texts/s) beside plain SentenceTransformer.encode of the same texts, same run.

    python -m bench builder_throughput [--kb banking77|obliqa] [--limit N] [--repeats 2]

Both sides exclude model loading; the builder side is the whole `build_bundle` (read, chunk,
encode with K/V capture, shard writes, assembly, FAISS index, checksums). Also reports the
bundle's bytes per chunk and per memory token.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
from pathlib import Path

from bench.common import plot_bars, timed_pair, write

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _kb(name: str, limit: int | None, tmp: Path) -> tuple[Path, list[str], dict]:
    if name == "banking77":
        with open(SHARED / "banking77" / "train.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))[:limit]
        path = tmp / "b77.jsonl"
        path.write_text("".join(json.dumps({"id": f"t{i}", "text": r["text"], "label": r["category"]}) + "\n" for i, r in enumerate(rows)))
        return path, [r["text"] for r in rows], {"memory": "kv"}  # what builder_*.json recorded: float32 K/V
    recs = []
    for p in sorted((SHARED / "obliqa_dev" / "documents").glob("*.json"), key=lambda p: int(p.stem)):
        recs += [{"id": r["ID"], "text": r["Passage"]} for r in json.loads(p.read_text()) if r["Passage"].strip()]
    recs = recs[:limit]
    path = tmp / "obliqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path, [r["text"] for r in recs], {"memory": "kv", "kv_dtype": "float16"}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kb", default="banking77", choices=["banking77", "obliqa"])
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)


def run(args: argparse.Namespace) -> dict:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.model.encoder import Encoder

    enc = Encoder()
    tmp = Path(tempfile.mkdtemp(prefix="softknn-bench-"))
    try:
        kb, texts, extra = _kb(args.kb, args.limit, tmp)
        cfg = BuildConfig(batch_size=args.batch_size, **extra)
        out = tmp / "bundle"
        build, encode = timed_pair(
            lambda: build_bundle(kb, out, cfg, enc, force=True, progress=False),
            lambda: enc.st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True),
            args.repeats,
        )
        m = json.loads((out / "manifest.json").read_text())
        total = sum(f["bytes"] for f in m["files"].values())
        n, ntok = m["counts"]["chunks"], m["counts"]["tokens"]
        res = {
            "kb": args.kb,
            "texts": len(texts),
            "chunks": n,
            "memory_tokens": ntok,
            "kv_dtype": m["kv_dtype"],
            "build": {**build, "texts_per_s": len(texts) / build["median_s"]},
            "encode": {**encode, "texts_per_s": len(texts) / encode["median_s"]},
            "ratio_build_over_encode_throughput": encode["median_s"] / build["median_s"],
            "bundle_bytes": total,
            "bytes_per_chunk": total / n,
            "bytes_per_memory_token": (m["files"]["kv_keys.npy"]["bytes"] + m["files"]["kv_values.npy"]["bytes"]) / ntok,
            "files": {k: v["bytes"] for k, v in m["files"].items()},
        }
        name = f"builder_{args.kb}"
        written = write(name, res)
        plot_bars(name, ["softknn build", "ST encode"], [res["build"]["texts_per_s"], res["encode"]["texts_per_s"]],
                  [(len(texts) / build["max_s"], len(texts) / build["min_s"]), (len(texts) / encode["max_s"], len(texts) / encode["min_s"])],
                  "texts / s", f"Builder vs plain encode ({args.kb}, {len(texts)} texts)")
        print(json.dumps({k: v for k, v in res.items() if k not in ("files",)}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


if __name__ == "__main__":  # python -m bench builder_throughput: the same as python -m bench builder_throughput
    import sys

    from bench.__main__ import main

    main(["builder_throughput", *sys.argv[1:]])
