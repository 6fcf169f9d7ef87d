"""Hybrid retrieval over a sharded KB at growing N, fixed shard size: the serving side's cost per query.

    python -m bench shard_scaling [--shard-rows 10000] [--shards 1,2,4,8] [--queries 60] [--name shard_scaling]

A KB of N = shards × shard-rows synthetic chunks (bench/filters.py's recipe: random unit vectors
with clustered copies, texts of Zipf-drawn words), its BM25 index built over all N (the whole KB's
statistics) and sliced per shard (softknn.storage.shards.slice_lexical, as `softknn build --shards`), each
shard a softknn.storage.shards.Shard over its rows (flat index) in this process (LocalShards). Each query (a
vector near a chunk, six of its words) goes through `Retriever.retrieve` (hybrid, k 8, m 200), the
two paths interleaved in one loop:

- `candidates` (the library): one Shard.lexical_candidates call per shard, each sending its own
  dense top, BM25 top m and their scores; merged at the serving side (retrieval.topk_candidates);
- `score vectors` (the previous path, the alternative): each shard's dense top, then its BM25 score
  of every chunk (N floats per input in all) and the candidates' dot products, normalised over N.

Every shard call is timed where it runs, so the figure splits into the serving side's own time
(wall − the shards' time: what grows with the KB when it grows) and the mean time of one shard's
calls (what each shard machine spends; in a deployment the shards run in parallel), plus the bytes
the shards send per query. Both paths' R are compared (same ids, order, scores within 1e-4).
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

from bench.common import RESULTS, summary, write
from bench.filters import COPY_NOISE, DIM, QUERY_NOISE, SEED, VOCAB, WORDS_PER_CHUNK

PATHS = ("candidates", "score vectors")


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shard-rows", type=int, default=10_000)
    ap.add_argument("--shards", default="1,2,4,8", help="shard counts (N = shards × shard rows)")
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--name", default="shard_scaling")


def _nbytes(x) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, list | tuple):
        return sum(_nbytes(y) for y in x)
    return 8


class TimedShards:
    """LocalShards whose calls are timed per shard (seconds and result bytes, added to `acc`)."""

    def __init__(self, shards):
        self.shards, self.acc = shards, {"s": 0.0, "bytes": 0, "calls": 0}

    def call(self, method: str, args: list[tuple]) -> list:
        return self.call_some(method, list(range(len(self.shards))), args)

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        out = []
        for s, a in zip(shards, args, strict=True):
            t = time.perf_counter()
            r = getattr(self.shards[s], method)(*a)
            self.acc["s"] += time.perf_counter() - t
            self.acc["bytes"] += _nbytes(r)
            self.acc["calls"] += 1
            out.append(r)
        return out

    def health(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class ScoreVectors:
    """The sharded bundle without `lexical_candidates`: the Retriever takes the score-vector path."""

    def __init__(self, b):
        self._b = b

    def __len__(self) -> int:
        return len(self._b)

    def __getattr__(self, name):
        if name == "lexical_candidates":
            raise AttributeError(name)
        return getattr(self._b, name)


def kb(n: int, rng: np.random.Generator):
    base = rng.standard_normal((max(1, n // 10), DIM), dtype=np.float32)
    xb = base[rng.integers(0, len(base), n)] + COPY_NOISE * rng.standard_normal((n, DIM), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    zipf = np.minimum(rng.zipf(1.3, (n, WORDS_PER_CHUNK)), VOCAB) - 1
    return xb, [" ".join(f"w{w}" for w in row) for row in zipf]


def sharded(xb: np.ndarray, texts: list[str], shard_rows: int):
    """A ShardedBundle of len(xb) / shard_rows Shards in this process (timed), BM25 with the whole KB's statistics."""
    from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec, build_index
    from softknn.retrieval.lexical import LexicalIndex
    from softknn.storage.shards import Shard, ShardedBundle, _Index, _Lexical, shard_ranges, slice_lexical

    n = len(xb)
    lex = LexicalIndex.build(texts)
    spec = IndexSpec("flat", {}, "bench")
    shards, parts, lo = [], [], []
    for a, b in shard_ranges(n, n // shard_rows):
        x = np.ascontiguousarray(xb[a:b])
        part = LexicalIndex(slice_lexical(lex, a, b), lex.spec)
        sh = Shard.__new__(Shard)
        sh.bundle = SimpleNamespace(index=ChunkIndex(build_index(x, spec), x, spec), lexical=part)  # type: ignore[assignment]
        sh.lo, sh.n = a, b - a
        shards.append(sh)
        parts.append(part)
        lo.append(a)
    backend = TimedShards(shards)
    manifest = SimpleNamespace(calibration=SimpleNamespace(retrieval_defaults=None), version_id="bench")
    chunks = [{"chunk_id": f"c{i}"} for i in range(n)]
    bundle = ShardedBundle(path=None, manifest=manifest, backend=backend, chunks=chunks, lo=lo)  # type: ignore[arg-type]
    bundle.index = _Index(bundle, spec)
    bundle.lexical = _Lexical(bundle, parts)
    return bundle, backend


def run(args) -> dict:
    import faiss
    import torch

    from softknn.retrieval.search import InferParams, Retriever

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    counts = [int(x) for x in args.shards.split(",")]
    rng = np.random.default_rng(SEED)
    xb_all, texts_all = kb(max(counts) * args.shard_rows, rng)
    rows, raw = [], {}
    for S in counts:
        n = S * args.shard_rows
        t0 = time.perf_counter()
        bundle, backend = sharded(xb_all[:n], texts_all[:n], args.shard_rows)
        build_s = time.perf_counter() - t0
        rets = {"candidates": Retriever(bundle), "score vectors": Retriever(ScoreVectors(bundle))}  # type: ignore[arg-type]
        qrng = np.random.default_rng(SEED + 1)
        near = qrng.integers(0, n, args.queries + args.warmup)
        xq = xb_all[near] + QUERY_NOISE * qrng.standard_normal((len(near), DIM), dtype=np.float32)
        xq /= np.linalg.norm(xq, axis=1, keepdims=True)
        qtext = [" ".join(texts_all[i].split()[:6]) for i in near]
        params = rets["candidates"].resolve([InferParams(retrieval="hybrid")])
        got = {p: {"serving": [], "shard": [], "bytes": [], "calls": []} for p in PATHS}
        same = True
        for j in range(len(near)):
            res = {}
            for path in (PATHS if j % 2 else PATHS[::-1]):
                backend.acc.update(s=0.0, bytes=0, calls=0)
                t = time.perf_counter()
                res[path] = rets[path].retrieve(xq[j : j + 1], params, [qtext[j]])
                wall = time.perf_counter() - t
                if j >= args.warmup:
                    got[path]["serving"].append(wall - backend.acc["s"])
                    got[path]["shard"].append(backend.acc["s"] / S)
                    got[path]["bytes"].append(backend.acc["bytes"])
                    got[path]["calls"].append(backend.acc["calls"] / S)
            a, b = res["candidates"], res["score vectors"]
            same &= a.rows[0] == b.rows[0] and bool(np.allclose(a.scores[0], b.scores[0], atol=1e-4, rtol=0))
        row = {"shards": S, "chunks": n, "build_s": round(build_s, 1), "same_R": bool(same)}
        for path in PATHS:
            g = got[path]
            row[path] = {"serving_ms": summary(g["serving"], (50, 90), 1e3, "_ms"),
                         "per_shard_ms": summary(g["shard"], (50,), 1e3, "_ms"),
                         "bytes_per_query": int(np.median(g["bytes"])),
                         "calls_per_shard": float(np.median(g["calls"]))}
        rows.append(row)
        raw[n] = got
        print(n, {p: (round(row[p]["serving_ms"]["p50_ms"], 2), round(row[p]["per_shard_ms"]["p50_ms"], 2),
                      row[p]["bytes_per_query"]) for p in PATHS}, "same R", same, flush=True)
        bundle.close()
    out = write(args.name, {"command": args.command, "shard_rows": args.shard_rows, "queries": args.queries,
                            "retrieval": "hybrid", "k": 8, "candidates": 200, "index": "flat", "rows": rows})
    plot(rows, args.name)
    return out


def plot(rows: list[dict], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["chunks"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for path, style in zip(PATHS, ("o-", "s--"), strict=True):
        a.plot(n, [r[path]["serving_ms"]["p50_ms"] for r in rows], style, label=f"{path}: serving side")
        a.plot(n, [r[path]["per_shard_ms"]["p50_ms"] for r in rows], style, alpha=0.5, label=f"{path}: one shard")
        b.plot(n, [r[path]["bytes_per_query"] / 1e3 for r in rows], style, label=path)
    a.set_xlabel("KB chunks (shards × fixed shard size)")
    a.set_ylabel("p50 ms per query")
    a.legend(fontsize=7)
    b.set_xlabel("KB chunks")
    b.set_ylabel("kB the shards send per query")
    b.legend(fontsize=7)
    fig.suptitle("hybrid retrieval over a sharded KB, fixed shard size", fontsize=10)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    main(["shard_scaling", *sys.argv[1:]])
