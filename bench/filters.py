"""Filtered retrieval: retrieval-stage latency with and without a filter, and exactness against brute force.

One KB of N chunks (default 100,000; random unit vectors with clustered copies, texts of Zipf-drawn
words so BM25 has posting lists of every length) behind the index the builder picks at that size
(`auto`: HNSW past 20,000 chunks) and its BM25 index. Each query (a vector near a KB chunk, a few of
its words) is retrieved, side by side in one interleaved loop:

- `none`: no filter (the unfiltered fast path);
- `1%`: a metadata equality passing 1% of the chunks, by the library's choice (the passing chunks
  scored by brute force below FILTER_SCAN_MAX);
- `1% selector`: the same filter forced through the index's FAISS ID selector (the alternative);
- `10%`: passing 10% (10,000 at 100k: still the brute force);
- `50%`: a range passing half the chunks (the ID selector, by the library's choice: efSearch
  widened by N/|passing|, here 2×);
- `50% unwidened`: the same at the index's own efSearch (the alternative);

for dense and hybrid retrieval. p50/p90 of wall milliseconds per query (one thread), the ratio of each
filtered p50 to the unfiltered one, and exactness: the share of queries whose R equals the brute force
over the passing chunks (`exact: true`), and recall@k for the approximate paths.

    python -m bench filters [--chunks 100000] [--queries 200] [--k 8] [--index auto] [--name filters]
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from bench.common import RESULTS, summary, write

SEED = 1234
DIM = 384
VOCAB = 20_000
WORDS_PER_CHUNK = 40
COPY_NOISE = 0.05
QUERY_NOISE = 0.03


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--index", default="auto", help="auto | flat | hnsw | ivf (softknn.retrieval.chunk_index.choose_index)")
    ap.add_argument("--threads", type=int, default=1, help="faiss/torch threads while timing")
    ap.add_argument("--name", default="filters")


def _kb(n: int, index_kind: str, threads: int):
    """A Retriever-ready stand-in for a bundle: index, BM25, chunks with metadata (bucket 0..99, rank 0..n−1)."""
    import faiss

    from softknn.retrieval.chunk_index import ChunkIndex, build_index, choose_index
    from softknn.retrieval.lexical import LexicalIndex

    rng = np.random.default_rng(SEED)
    base = rng.standard_normal((max(1, n // 10), DIM), dtype=np.float32)
    xb = base[rng.integers(0, len(base), n)] + COPY_NOISE * rng.standard_normal((n, DIM), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    zipf = np.minimum(rng.zipf(1.3, (n, WORDS_PER_CHUNK)), VOCAB) - 1
    texts = [" ".join(f"w{w}" for w in row) for row in zipf]
    spec = choose_index(n, DIM, index_kind)
    t0 = time.perf_counter()
    faiss.omp_set_num_threads(max(2, threads))  # the build only; build_index itself pins 1 thread
    index = build_index(xb, spec)
    build_s = time.perf_counter() - t0
    lex = LexicalIndex.build(texts)
    buckets = rng.integers(0, 100, n)
    chunks = [{"chunk_id": f"c{i}", "doc_id": f"d{i}", "label": None, "text": texts[i],
               "metadata": {"bucket": int(buckets[i]), "rank": i}} for i in range(n)]
    manifest = SimpleNamespace(calibration=SimpleNamespace(retrieval_defaults=None))

    class KB(SimpleNamespace):
        def __len__(self) -> int:
            return n

    return KB(index=ChunkIndex(index, xb, spec), lexical=lex, chunks=chunks, manifest=manifest), texts, xb, build_s


@contextmanager
def _variant(name: str):
    """The alternatives: `selector` forces the index's ID selector, `unwidened` keeps its own efSearch."""
    from softknn.retrieval import chunk_index, search

    saved = search.FILTER_SCAN_MAX, search.FILTER_INDEX_SHARE, chunk_index.FILTER_WIDEN
    if name.endswith("selector"):
        search.FILTER_SCAN_MAX, search.FILTER_INDEX_SHARE = 0, 0.0
    if name.endswith("unwidened"):
        chunk_index.FILTER_WIDEN = 1.0
    try:
        yield
    finally:
        search.FILTER_SCAN_MAX, search.FILTER_INDEX_SHARE, chunk_index.FILTER_WIDEN = saved


def run(args) -> dict:
    import faiss
    import torch

    from softknn.retrieval.filters import parse_filter
    from softknn.retrieval.search import InferParams, Retriever

    kb, texts, xb, build_s = _kb(args.chunks, args.index, args.threads)
    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    ret = Retriever(kb)  # type: ignore[arg-type]  # the stand-in has the attributes a Retriever reads
    rng = np.random.default_rng(SEED + 1)
    near = rng.integers(0, args.chunks, args.queries)
    xq = xb[near] + QUERY_NOISE * rng.standard_normal((args.queries, DIM), dtype=np.float32)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    qtext = [" ".join(texts[i].split()[:6]) for i in near]
    one = parse_filter({"field": "metadata.bucket", "eq": 0})
    half = parse_filter({"field": "metadata.rank", "lt": args.chunks // 2})
    filters = {"none": None, "1%": one, "1% selector": one,
               "10%": parse_filter({"field": "metadata.bucket", "lt": 10}), "50%": half, "50% unwidened": half}
    t0 = time.perf_counter()
    ret.passing(filters["1%"])  # the columns are read once, on the first filter
    table_s = time.perf_counter() - t0
    out: dict = {"chunks": args.chunks, "queries": args.queries, "k": args.k, "index": kb.index.spec.kind,
                 "index_build_s": round(build_s, 1), "filter_columns_s": round(table_s, 3),
                 "passing": {name: None if f is None else int(ret.passing(f).size) for name, f in filters.items()},
                 "command": args.command, "modes": {}}
    for mode in ("dense", "hybrid"):
        base = ret.resolve([InferParams(k=args.k, retrieval=mode)])[0]
        times: dict[str, list[float]] = {name: [] for name in filters}
        rows: dict[str, list[list[int]]] = {name: [] for name in filters}
        for q in range(args.queries):  # interleaved: drifting load hits every variant alike
            for name, f in filters.items():
                p = [replace(base, filter=f)]
                with _variant(name):
                    t = time.perf_counter()
                    r = ret.retrieve(xq[q : q + 1], p, qtext[q : q + 1])
                    times[name].append(time.perf_counter() - t)
                rows[name].append(r.rows[0])
        res: dict = {}
        for name, f in filters.items():
            brute = [ret.retrieve(xq[q : q + 1], [replace(base, filter=f, exact=True)], qtext[q : q + 1]).rows[0]
                     for q in range(args.queries)]
            same = np.mean([a == b for a, b in zip(rows[name], brute, strict=True)])
            recall = np.mean([len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(rows[name], brute, strict=True)])
            res[name] = {**summary(times[name], (50, 90), 1e3, "_ms"), "same_R_as_brute_force": float(same),
                         "recall_at_k": float(recall)}
        for name in filters:
            res[name]["p50_vs_unfiltered"] = res[name]["p50_ms"] / res["none"]["p50_ms"]
        out["modes"][mode] = res
    _plot(args.name, out)
    return write(args.name, out)


def _plot(name: str, out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(out["passing"])
    width = 0.38
    for j, mode in enumerate(out["modes"]):
        vals = [out["modes"][mode][n]["p50_ms"] for n in names]
        ax.bar(np.arange(len(names)) + (j - 0.5) * width, vals, width, label=mode)
    ax.set_xticks(np.arange(len(names)), names)
    ax.set_ylabel("retrieval p50 (ms per query)")
    ax.set_title(f"filtered retrieval, {out['chunks']:,} chunks, {out['index']} index, k={out['k']}")
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=120)
    plt.close(fig)
