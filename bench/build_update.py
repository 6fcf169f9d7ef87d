"""A KB update rebuilt through the encode cache (`softknn build --cache`) beside a fresh build of the same KB, same run.

    python -m bench build_update [--passages 4000] [--changed 0.01] [--shards 1] [--memory hidden] [--repeats 2]

The KB is the first N passages of ../shared/data/obliqa_dev. Version 1 is built through an empty
cache once (untimed). Version 2 changes a fraction of the passages (a sentence appended), deletes as
many and adds as many new ones (the next passages of the corpus). Then, alternating, `repeats` times:
a fresh build of version 2 (no cache) and a build of version 2 through a copy of the cache as
version 1 left it (the copy is made outside the timing). Reported: wall and CPU seconds of both,
chunks encoded and reused, and how far the cached build's output is from the fresh one: max |Δ| of
embeddings and memory rows, whether chunks, spans and BM25 files are the same bytes, and whether the
top-10 evidence ids of 200 of the corpus's questions are the same (dense and hybrid).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bench.common import plot_bars, timed_pair, write

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "obliqa_dev"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--passages", type=int, default=4000)
    ap.add_argument("--changed", type=float, default=0.01, help="share of passages changed (as many deleted, as many added)")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--memory", default="hidden")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--questions", type=int, default=200)


def _passages() -> list[dict]:
    recs = []
    for p in sorted((SHARED / "documents").glob("*.json"), key=lambda p: int(p.stem)):
        recs += [{"id": r["ID"], "text": r["Passage"]} for r in json.loads(p.read_text()) if r["Passage"].strip()]
    return recs


def _write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run(args: argparse.Namespace) -> dict:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder
    from softknn.storage.bundle import load_bundle

    corpus = _passages()
    n, m = args.passages, max(1, round(args.passages * args.changed))
    v1 = corpus[:n]
    rng = np.random.default_rng(0)
    picked = rng.choice(n, size=2 * m, replace=False)
    changed, deleted = set(picked[:m].tolist()), set(picked[m:].tolist())
    v2 = [dict(r, text=r["text"] + " This requirement is reviewed annually.") if i in changed else r
          for i, r in enumerate(v1) if i not in deleted] + corpus[n : n + m]
    enc = Encoder()
    cfg = BuildConfig(memory=args.memory, shards=args.shards)
    tmp = Path(tempfile.mkdtemp(prefix="softknn-bench-update-"))
    try:
        kb1, kb2 = _write(tmp / "v1" / "kb.jsonl", v1), _write(tmp / "v2" / "kb.jsonl", v2)
        seed = tmp / "cache-v1"
        build_bundle(kb1, tmp / "b1", cfg, enc, progress=False, cache=seed)
        stats: dict = {}
        cache = tmp / "cache"

        def fresh():
            build_bundle(kb2, tmp / "fresh", cfg, enc, force=True, progress=False)

        def cached():
            build_bundle(kb2, tmp / "cached", cfg, enc, force=True, progress=False, cache=cache, stats=stats)

        def cached_from_v1():
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(seed, cache)
            return cached

        runs_f, runs_c = [], []
        for _ in range(args.repeats):  # alternating; the cache copy is outside the timed call
            fn = cached_from_v1()
            f, c = timed_pair(fresh, fn, 1)
            runs_f.append(f)
            runs_c.append(c)

        def agg(rs):
            w = [r["runs"][0] for r in rs]
            return {"median_s": float(np.median(w)), "min_s": min(w), "max_s": max(w), "runs": w,
                    "cpu_median_s": float(np.median([r["cpu_median_s"] for r in rs]))}

        t_fresh, t_cached = agg(runs_f), agg(runs_c)
        a, b = tmp / "cached", tmp / "fresh"
        files = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
        floats = ("embeddings.npy", "kv_keys.npy", "kv_values.npy", "mem_hidden.npy")
        same_bytes = {f: _sha(a / f) == _sha(b / f) for f in files
                      if Path(f).name in ("chunks.jsonl", "token_spans.npy", "chunk_tokens.npy")
                      or "lexical" in Path(f).parts}
        max_delta = {}
        for f in files:
            if Path(f).name in floats:
                x, y = np.load(a / f).astype(np.float64), np.load(b / f).astype(np.float64)
                max_delta[f] = float(np.abs(x - y).max())
        questions = [q["Question"] for q in json.loads((SHARED / "questions.json").read_text())[: args.questions]]
        ea, eb = (Engine(enc, load_bundle(p, expected_fingerprint=enc.info.fingerprint)) for p in (a, b))
        same_evidence = {}
        for mode in ("dense", "hybrid"):
            p = InferParams(retrieval=mode, k=10)
            ra, rb = ea.infer(questions, p), eb.infer(questions, p)
            same_evidence[mode] = sum([e.chunk_id for e in x.evidence] == [e.chunk_id for e in y.evidence]
                                      for x, y in zip(ra, rb, strict=True)) / len(questions)
        res = {
            "kb": f"obliqa_dev first {n} passages", "update": {"changed": m, "deleted": m, "added": m},
            "memory": args.memory, "shards": args.shards, "chunks": stats["chunks"],
            "cached_build": {**t_cached, "chunks_encoded": stats["encoded"], "chunks_reused": stats["reused"]},
            "fresh_build": t_fresh,
            "speedup_wall": t_fresh["median_s"] / t_cached["median_s"],
            "same_bytes": same_bytes, "all_same_bytes": all(same_bytes.values()),
            "max_abs_delta": max_delta, "same_top10_evidence_share": same_evidence,
        }
        name = ("build_update" + ("" if n == 4000 else f"_{n}")
                + ("" if args.shards == 1 else f"_{args.shards}shards_{args.memory}"))
        written = write(name, res)
        plot_bars(name, ["fresh build", "through the cache"], [t_fresh["median_s"], t_cached["median_s"]],
                  [(t_fresh["min_s"], t_fresh["max_s"]), (t_cached["min_s"], t_cached["max_s"])], "seconds",
                  f"KB update, {n} passages, {m} changed + {m} deleted + {m} added ({args.memory}, {args.shards} shard(s))")
        print(json.dumps(res, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


if __name__ == "__main__":  # python -m bench.build_update: the same as python -m bench build_update
    import sys

    from bench.__main__ import main

    main(["build_update", *sys.argv[1:]])
