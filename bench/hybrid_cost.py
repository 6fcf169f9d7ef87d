"""Cost of hybrid retrieval: retrieval-stage latency, dense vs hybrid vs lexical, and bytes per chunk.

KBs of 10k and 100k chunks, optionally 1M.

    nice -n 5 python -m bench hybrid_cost [--sizes 10000,100000] [--queries 200] [--rounds 3]
                                          [--vectors real|random] [--index auto] [--check 50]
                                          [--profile] [--merge] [--name hybrid_cost]

How it measures (the KB, the queries, what is timed and checked): docs/benchmarks.md, "Methods",
`hybrid_cost`.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import json
import os
import pstats
import random
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, summary, write

ROOT = Path(__file__).resolve().parents[1]

SHARED = ROOT.parent / "shared" / "data"
OBLIQA = ROOT / "artifacts" / "eval" / "obliqa"
BUNDLES = ROOT / "artifacts" / "eval" / "bundles"
SCRATCH = ROOT / "artifacts" / "bench" / "hybrid_cost"
SEED = 1234
DIM = 384
COPY_NOISE = 0.02  # σ per dimension of a copy's vector around its base text's
QUERY_NOISE = 0.05  # σ per dimension of a query's vector around its neighbour's (cos ≈ 0.7)
MODES = ("dense", "hybrid", "lexical")
TARGET_MS = 2.0
# docs/benchmarks.md §6: K/V of the real bundle, float32, "≈ 76 KB/chunk (25 memory tokens × 12 heads
# × 32 × 2 × 4 B)", 76,409 MB at 1M chunks
KV_BYTES_PER_CHUNK_FORMULA = 25 * 12 * 32 * 2 * 4
KV_BYTES_PER_CHUNK_QUOTED = 76_409
SPLIT = re.compile(r"(?<=[.!?;])\s+|\n+")
# Written into the results JSON as "history": the figures of the earlier library path (topk_fast took
# b_(m) with a second np.partition over N; lexical retrieval searched the dense top m) beside the
# one-partition topk_fast the library now implements; docs/benchmarks.md, "Methods", `hybrid_cost`.
HISTORY = {
    "what": "hybrid − dense p50 (ms, wall and process CPU) and paired medians of the library path before commit "
            "047e935 (topk_fast took b_(m) with np.partition(b, N − m) and b_(1) with b.max(), over N, besides the "
            "top-m argpartition; lexical retrieval searched the dense top m), and of the bench-local "
            "topk_fast_one_partition timed in the same interleaved loop (same answers on every query), which the "
            "library now implements",
    "run": {"when": "2026-12-01T05:21:50+00:00", "command": "nice -n 5 python -m bench hybrid_cost --sizes 10000,100000,1000000",
            "loadavg_start": [6.03, 6.69, 6.13]},
    "library_before": {
        "10000": {"wall_p50": 2.010, "cpu_p50": 1.725, "paired_wall": 1.777, "paired_cpu": 1.692},
        "100000": {"wall_p50": 4.400, "cpu_p50": 2.482, "paired_wall": 3.834, "paired_cpu": 2.313},
        "1000000": {"wall_p50": 17.373, "cpu_p50": 10.278, "paired_wall": 16.999, "paired_cpu": 10.198},
    },
    "one_partition_fix_same_loop": {
        "10000": {"wall_p50": 1.716, "cpu_p50": 1.541, "paired_wall": 1.598, "paired_cpu": 1.515},
        "100000": {"wall_p50": 1.916, "cpu_p50": 1.633, "paired_wall": 1.698, "paired_cpu": 1.599},
        "1000000": {"wall_p50": 10.453, "cpu_p50": 6.571, "paired_wall": 10.276, "paired_cpu": 6.592},
    },
    "library_before_100000_cpu_p50_range_three_runs": [1.88, 2.48],
    "note": "100k CPU range over that session's three runs as reported by it; the two kept on disk give 1.878 "
            "(2026-12-01T05:05:53Z, 10k/100k) and 2.482 (the run above). Wall moved more with the shared box's load: "
            "hybrid − dense wall p50 at 100k 2.70–4.98 ms over its four logged runs",
}


# --- the KB -----------------------------------------------------------------------------------
def base_texts() -> tuple[list[str], list[str], list[str]]:
    """(texts, source ids, banking77 intents or "") of the B base texts, seeded order."""
    recs = []
    with open(OBLIQA / "kb.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            recs.append((r["Passage"], f"obliqa:{r['ID']}", ""))
    with open(SHARED / "banking77" / "train.csv", newline="", encoding="utf-8") as f:
        recs += [(r["text"], f"b77:{i}", r["category"]) for i, r in enumerate(csv.DictReader(f))]
    random.Random(SEED).shuffle(recs)
    return [r[0] for r in recs], [r[1] for r in recs], [r[2] for r in recs]


def variant(text: str, j: int, c: int) -> str:
    """Copy c of base text j (module docstring)."""
    if c == 0:
        return text
    sents = [s.strip() for s in SPLIT.split(text) if s.strip()] or [text]
    rng = random.Random(SEED * 1_000_003 + j * 1_009 + c)
    rng.shuffle(sents)
    if len(sents) >= 3:
        del sents[rng.randrange(len(sents))]
    return " ".join(sents) + f" copy{c}"


def kb_texts(n: int, base: list[str]) -> list[str]:
    b = len(base)
    return [variant(base[i % b], i % b, i // b) for i in range(n)]


def real_base_vectors(ids: list[str]) -> np.ndarray:
    """(B, DIM) float32: each base text's real embedding from the evaluation bundles."""
    need = [BUNDLES / "obliqa" / "embeddings.npy", BUNDLES / "obliqa" / "chunks.jsonl",
            BUNDLES / "banking77" / "embeddings.npy"]
    if not all(p.is_file() for p in need):
        raise SystemExit(f"--vectors real needs {', '.join(str(p.relative_to(ROOT)) for p in need)} "
                         "(see bench/hybrid_obliqa.py, bench/hybrid_banking77.py); or pass --vectors random")
    oemb = np.load(need[0], mmap_mode="r")
    first: dict[str, int] = {}
    with open(need[1], encoding="utf-8") as f:
        for r, line in enumerate(f):
            first.setdefault(str(json.loads(line)["doc_id"]), r)
    bemb = np.load(need[2], mmap_mode="r")
    out = np.empty((len(ids), DIM), dtype=np.float32)
    for j, s in enumerate(ids):
        src, key = s.split(":", 1)
        if src == "obliqa":
            if key not in first:
                raise SystemExit(f"ObliQA passage {key} has no chunk in {need[1]}")
            out[j] = oemb[first[key]]
        else:
            out[j] = bemb[int(key)]
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def real_query_vectors(qs: list[dict]) -> np.ndarray:
    """(Q, DIM) float32: the queries' real embeddings (the caches of the hybrid sweeps)."""
    import glob
    import hashlib

    fp = json.loads((BUNDLES / "banking77" / "manifest.json").read_text())["model"]["fingerprint"]
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        bt = [r["text"] for r in csv.DictReader(f)]
    h = hashlib.sha256(("\x00".join(bt) + fp).encode()).hexdigest()[:16]
    bpath = ROOT / "artifacts" / "eval" / "hybrid_banking77" / f"emb_test_{h}.npy"
    by_id = {}
    for path in sorted(glob.glob(str(ROOT / "artifacts" / "eval" / "hybrid_obliqa" / "qemb_*.npz"))):
        z = np.load(path)
        by_id.update({str(i): e for i, e in zip(z["ids"], z["emb"], strict=True)})
    if not bpath.is_file():
        raise SystemExit(f"--vectors real needs {bpath.relative_to(ROOT)} (bench/hybrid_banking77.py); or --vectors random")
    bemb = np.load(bpath)
    out = []
    for q in qs:
        if q["source"] == "obliqa_val":
            if q["key"] not in by_id:
                raise SystemExit(f"no cached embedding of ObliQA question {q['key']} (bench/hybrid_obliqa.py)")
            out.append(by_id[q["key"]])
        else:
            out.append(bemb[int(q["key"])])
    x = np.asarray(out, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def kb_vectors(n: int, b: int, real: np.ndarray | None = None) -> np.ndarray:
    """(n, DIM) float32 unit rows: real (or random) per base text, noisy copies beyond (module docstring)."""
    rng = np.random.default_rng(SEED)
    if real is not None:
        base = np.ascontiguousarray(real[: min(n, b)], dtype=np.float32)
    else:
        base = rng.standard_normal((min(n, b), DIM), dtype=np.float32)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
    xb = np.empty((n, DIM), dtype=np.float32)
    xb[: len(base)] = base
    step = 1 << 16
    for s in range(len(base), n, step):
        e = min(n, s + step)
        x = base[np.arange(s, e) % b] + COPY_NOISE * rng.standard_normal((e - s, DIM), dtype=np.float32)
        xb[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return xb


def query_set(n_queries: int, ids: list[str], intents: list[str]) -> list[dict]:
    """Real query texts, half ObliQA validation questions, half Banking77 test texts, interleaved;
    each with the base rows its vector may sit near (gold passages / same-intent train texts)."""
    rng = random.Random(SEED + 1)
    row_of = {s: j for j, s in enumerate(ids)}
    with open(OBLIQA / "questions_val.jsonl", encoding="utf-8") as f:
        qa = [json.loads(line) for line in f]
    rng.shuffle(qa)
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        bt = [dict(r, row=i) for i, r in enumerate(csv.DictReader(f))]
    rng.shuffle(bt)
    by_intent: dict[str, list[int]] = {}
    for j, t in enumerate(intents):
        if t:
            by_intent.setdefault(t, []).append(j)
    oq = [{"text": q["text"], "source": "obliqa_val", "key": str(q["id"]),
           "near": [row_of[f"obliqa:{g}"] for g in q.get("gold_ids", []) if f"obliqa:{g}" in row_of]} for q in qa]
    bq = [{"text": r["text"], "source": "banking77_test", "key": str(r["row"]), "near": by_intent.get(r["category"], [])}
          for r in bt]
    out = [x for pair in zip(oq, bq) for x in pair]
    if n_queries > len(out):
        raise SystemExit(f"--queries {n_queries}: at most {len(out)} real queries")
    return out[:n_queries]


def query_vectors(qs: list[dict], xb: np.ndarray, b: int) -> tuple[np.ndarray, list[int]]:
    """(Q, DIM) unit rows near a KB row holding one of each query's `near` base texts (any copy)."""
    n = len(xb)
    rng = np.random.default_rng(SEED + 2)
    rows = []
    for q in qs:
        cands = [j + c * b for j in q["near"] for c in range((n - 1 - j) // b + 1)] if q["near"] else []
        cands = [r for r in cands if r < n]
        rows.append(int(cands[rng.integers(len(cands))]) if cands else int(rng.integers(n)))
    x = xb[rows] + QUERY_NOISE * rng.standard_normal((len(qs), DIM), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), rows


def dir_bytes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def dense_index(xb: np.ndarray, kind: str, vectors: str):
    """(faiss index, spec, build seconds or None when cached, serialized bytes) for choose_index(N, D, kind)."""
    import faiss

    from softknn.retrieval.chunk_index import build_index, choose_index

    spec = choose_index(len(xb), xb.shape[1], kind)
    build = {k: v for k, v in spec.params.items() if k != "efSearch"}
    tag = "-".join(f"{k}{v}" for k, v in sorted(build.items()))
    path = SCRATCH / f"index-{len(xb)}-{spec.kind}{'-' + tag if tag else ''}-{vectors}-seed{SEED}.faiss"
    build_s = None
    if path.is_file():
        index = faiss.read_index(str(path))
    else:
        t0 = time.perf_counter()
        index = build_index(xb, spec)
        build_s = time.perf_counter() - t0
        tmp = path.with_suffix(".tmp")
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
    return index, spec, build_s, path.stat().st_size


# --- timing -----------------------------------------------------------------------------------
def time_modes(engine, params: dict, xq: np.ndarray, texts: list[str], rounds: int) -> dict:
    """Per mode, wall and CPU ms of each retrieve, modes interleaved per query in rotating order."""
    wall = {m: [] for m in MODES}
    cpu = {m: [] for m in MODES}
    k = 0
    for _ in range(rounds):
        for i, text in enumerate(texts):
            for j in range(len(MODES)):
                m = MODES[(k + j) % len(MODES)]
                c0, t0 = time.process_time(), time.perf_counter()
                engine.retrieve(xq[i : i + 1], [params[m]], [text])
                wall[m].append((time.perf_counter() - t0) * 1e3)
                cpu[m].append((time.process_time() - c0) * 1e3)
            k += 1
    return {"wall": wall, "cpu": cpu}


def certification(engine, params: dict, xq: np.ndarray, texts: list[str]) -> dict:
    """How often topk_fast answered (certified) vs returned None (the brute force ran), per mode."""
    import softknn.infer.engine as eng

    real = eng.topk_fast
    counts = {"certified": 0, "fallback": 0}

    def counting(*a, **kw):
        r = real(*a, **kw)
        counts["certified" if r is not None else "fallback"] += 1
        return r

    out = {}
    eng.topk_fast = counting
    try:
        for m in ("hybrid", "lexical"):
            counts.update(certified=0, fallback=0)
            for i, text in enumerate(texts):
                engine.retrieve(xq[i : i + 1], [params[m]], [text])
            out[m] = dict(counts, rate=counts["certified"] / max(1, sum(counts.values())))
    finally:
        eng.topk_fast = real
    return out


def exactness(engine, params: dict, xq: np.ndarray, texts: list[str], tol: float = 1e-5) -> dict:
    """Fast path (exact=False) vs exact=True per mode: same ids and scores within tol; and topk_fast
    given the exact dense top m vs topk_reference (the fast path's algorithm without ANN error)."""
    from dataclasses import replace

    from softknn.retrieval.scoring import topk_fast, topk_reference

    index, lex = engine.bundle.index, engine.bundle.lexical
    n = len(engine.bundle)
    out = {}
    for m in MODES:
        same_ids = within = 0
        worst = 0.0
        pe = replace(params[m], exact=True)
        for i, text in enumerate(texts):
            a = engine.retrieve(xq[i : i + 1], [params[m]], [text])
            b = engine.retrieve(xq[i : i + 1], [pe], [text])
            ids_eq = a.rows[0] == b.rows[0]
            same_ids += ids_eq
            if ids_eq:
                d = float(np.abs(np.subtract(a.scores[0], b.scores[0])).max()) if a.scores[0] else 0.0
                worst = max(worst, d)
                within += d <= tol
        out[m] = {"queries": len(texts), "same_ids": same_ids, "same_ids_and_scores": within,
                  "max_score_diff_when_same_ids": worst}
    # the fast path's algorithm alone: dense top m taken exactly, so no ANN recall enters
    for m in ("hybrid", "lexical"):
        p = params[m]
        dsize = 1 if m == "lexical" else min(n, max(p.k, p.candidates))  # as Engine.retrieve asks
        agree = certified = 0
        for i, text in enumerate(texts):
            q = xq[i]
            b = lex.scores(lex.analyzer.terms(text))
            D, I = index.search_exact(q[None], dsize)
            f = topk_fast(D[0], I[0], lambda ids, q=q: index.rows_dot(ids, q), b, p.k, m, p.lexical_weight, p.candidates)
            d = index.similarities(q[None])[0].numpy()
            S, ids = topk_reference(d, b, p.k, m, p.lexical_weight, p.candidates)
            if f is None:
                continue
            certified += 1
            agree += bool(np.array_equal(f[1], ids) and np.abs(f[0] - S).max() <= tol)
        out[m]["topk_fast_with_exact_dense_vs_reference"] = {"certified": certified, "agree": agree}
    # the ANN's part in any difference: recall of the dense top m the hybrid asks for
    p = params["hybrid"]
    dsize = min(n, max(p.k, p.candidates))
    _, I = index.search(xq[: len(texts)], dsize)
    _, E = index.search_exact(xq[: len(texts)], dsize)
    out["dense_recall_at_m"] = float(np.mean([len(set(a) & set(b)) / dsize for a, b in zip(I.tolist(), E.tolist(), strict=True)]))
    out["m"] = dsize
    out["note"] = ("exact=True ranks by the exact dense top m; exact=False by the index's. With an ANN index "
                   "(HNSW) the hybrid normalises the dense scores with the ANN's m-th score, so where "
                   "dense_recall_at_m < 1 its scores can differ from the exact path's beyond 1e-5 with the same "
                   "ids; topk_fast_with_exact_dense_vs_reference is the fast path's own algorithm without ANN error")
    k = params["dense"].k
    _, I = index.search(xq[: len(texts)], k)
    out["dense_recall_at_k"] = float(np.mean([len(set(a) & set(b[:k])) / k for a, b in zip(I.tolist(), E.tolist(), strict=True)]))
    return out


def stage_breakdown(engine, params: dict, xq: np.ndarray, texts: list[str]) -> dict:
    """Median ms of each step of one hybrid retrieval (Retriever._lexical_select's calls and
    softknn.retrieval.scoring.topk_fast's steps, timed between them) and of the dense one; plus the BM25
    work: query terms and posting entries summed."""
    from softknn.infer.engine import Retrieval
    from softknn.retrieval.scoring import best, candidates, mix, norm_top, top_m

    index, lex = engine.bundle.index, engine.bundle.lexical
    n = len(engine.bundle)
    p, pd = params["hybrid"], params["dense"]
    dsize = min(n, max(p.k, p.candidates))
    names = ("analyze", "bm25_scores", "dense_search_m", "lexical_top_m_argpartition", "bm25_top1_topm_of_top_m",
             "candidates_union", "dense_of_candidates_mix_best", "select")
    st = {s: [] for s in names}
    dense_st = {"dense_search_k": [], "select": []}
    terms_n, postings = [], []
    for i, text in enumerate(texts):
        q = xq[i]
        t = [time.perf_counter()]
        words = lex.analyzer.words(text)
        t.append(time.perf_counter())
        terms = [w for w, _, _ in words]
        b = lex.scores(terms)
        t.append(time.perf_counter())
        D, I = index.search(q[None], dsize)
        t.append(time.perf_counter())
        lexi = top_m(b, p.candidates)
        t.append(time.perf_counter())
        b_lex = b[lexi]
        b_top1, b_topm = float(b_lex.max()), float(b_lex.min())
        t.append(time.perf_counter())
        cand = candidates(I[0], lexi)
        t.append(time.perf_counter())
        s = mix(norm_top(index.rows_dot(cand, q), float(D[0][0]), float(D[0][dsize - 1])),
                norm_top(b[cand], b_top1, b_topm), p.lexical_weight)
        S, ids = best(s, cand, p.k)
        dense = index.rows_dot(ids, q)
        t.append(time.perf_counter())
        out = Retrieval.empty(1)
        engine.select(out, 0, S, ids, dense, b[ids], p, n, "x")
        t.append(time.perf_counter())
        for s_, a, z in zip(names, t, t[1:], strict=False):
            st[s_].append((z - a) * 1e3)
        ids_ = lex.term_ids(terms)
        terms_n.append(len(ids_))
        postings.append(lex.postings(ids_))
        t0 = time.perf_counter()
        D8, I8 = index.search(q[None], min(n, pd.k))
        t1 = time.perf_counter()
        engine.select(out, 0, D8[0], I8[0], D8[0], None, pd, n, "x")
        t2 = time.perf_counter()
        dense_st["dense_search_k"].append((t1 - t0) * 1e3)
        dense_st["select"].append((t2 - t1) * 1e3)
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return {"hybrid_median_ms": med(st), "dense_median_ms": med(dense_st),
            "query_terms_in_vocab": summary(terms_n), "posting_entries_per_query": summary(postings),
            "posting_entries_per_query_over_n": statistics.median(postings) / n}


def profile(engine, params: dict, xq: np.ndarray, texts: list[str], top: int = 25) -> dict:
    """cProfile of the hybrid retrievals of every query: the functions by own time, and a text dump."""
    pr = cProfile.Profile()
    pr.enable()
    for i, text in enumerate(texts):
        engine.retrieve(xq[i : i + 1], [params["hybrid"]], [text])
    pr.disable()
    buf = io.StringIO()
    ps = pstats.Stats(pr, stream=buf).sort_stats("tottime")
    ps.print_stats(top)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _) in sorted(ps.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc,
                     "own_ms_per_query": tt * 1e3 / len(texts), "cum_ms_per_query": ct * 1e3 / len(texts)})
    return {"by_own_time": rows, "text": buf.getvalue()}


# --- one size ---------------------------------------------------------------------------------
def run_size(n: int, kind: str, n_queries: int, rounds: int, n_check: int, base, vectors: str,
             do_profile: bool, command: str) -> dict:
    import gc

    from softknn.retrieval.chunk_index import PREFILTER_MIN_CHUNKS, ChunkIndex
    from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
    from softknn.retrieval.search import InferParams, Retriever
    from softknn.storage.layout import Bundle
    from softknn.storage.manifest import Counts, IndexRecord, Manifest
    from softknn.storage.memory_stores import KVStore

    texts_b, ids_b, intents_b, real_b = base
    load_start = [round(x, 2) for x in os.getloadavg()]
    b = len(texts_b)
    t0 = time.perf_counter()
    texts = kb_texts(n, texts_b)
    texts_s = time.perf_counter() - t0
    xb = kb_vectors(n, b, real_b)

    t0 = time.perf_counter()
    lex_built = LexicalIndex.build(texts)
    lex_build_s = time.perf_counter() - t0
    ldir = SCRATCH / f"lexical-{n}"
    lex_built.save(ldir)
    files = dir_bytes(ldir)
    lex_bytes = sum(files.values())
    vocab = len(lex_built.vocab)
    nnz = lex_built.n_postings
    del lex_built
    gc.collect()
    lex = LexicalIndex.load(ldir, LexicalSpec())

    index, spec, index_build_s, index_file_bytes = dense_index(xb, kind, vectors)
    t0 = time.perf_counter()
    cindex = ChunkIndex(index, xb, spec)
    index_ready_s = time.perf_counter() - t0
    kv = KVStore(np.zeros((1, 12, 32), np.float16), np.zeros((1, 12, 32), np.float16),
                 np.zeros(n, np.int64), np.zeros(n, np.int64))
    manifest = Manifest.model_construct(  # just what retrieval reads: no model, files or K/V here
        version_id=f"hybrid-cost-{n}-{spec.kind}", memory_layer=0,
        index=IndexRecord(kind=spec.kind, params=spec.params, reason=spec.reason), counts=Counts.model_construct(chunks=n))
    bundle = Bundle(path=SCRATCH, manifest=manifest, index=cindex, kv=kv,
                    chunks=[{"chunk_id": str(i)} for i in range(n)], token_spans=np.zeros((0, 2), np.int64),
                    lexical=lex)
    engine = Retriever(bundle)  # retrieval needs only the bundle
    params = dict(zip(MODES, engine.resolve([InferParams(k=8, retrieval=m) for m in MODES]), strict=True))

    qs = query_set(n_queries, ids_b, intents_b)
    qtexts = [q["text"] for q in qs]
    xq = real_query_vectors(qs) if vectors == "real" else query_vectors(qs, xb, b)[0]

    for i in range(min(10, len(qtexts))):  # warm-up: page in the memory-mapped postings, faiss, numpy
        for m in MODES:
            engine.retrieve(xq[i : i + 1], [params[m]], [qtexts[i]])
    pf0 = dict(cindex.prefilter_counts)
    t0 = time.perf_counter()
    timed = time_modes(engine, params, xq, qtexts, rounds)
    timed_s = time.perf_counter() - t0
    pf = {c: cindex.prefilter_counts[c] - pf0[c] for c in pf0}
    load_timed = [round(x, 2) for x in os.getloadavg()]
    modes = {m: {"wall_ms": summary(timed["wall"][m]), "cpu_ms": summary(timed["cpu"][m])} for m in MODES}
    paired = [h - d for h, d in zip(timed["wall"]["hybrid"], timed["wall"]["dense"], strict=True)]
    paired_cpu = [h - d for h, d in zip(timed["cpu"]["hybrid"], timed["cpu"]["dense"], strict=True)]
    delta = modes["hybrid"]["wall_ms"]["p50"] - modes["dense"]["wall_ms"]["p50"]

    cert = certification(engine, params, xq, qtexts)
    exact = exactness(engine, params, xq[:n_check], qtexts[:n_check])
    stages = stage_breakdown(engine, params, xq, qtexts)
    prof = profile(engine, params, xq, qtexts) if (do_profile or delta > TARGET_MS) else None
    if prof is not None:
        (SCRATCH / f"profile-{n}-{spec.kind}.txt").write_text(prof.pop("text"))

    flat_bytes = n * DIM * 4
    # the flat scan's 8-bit prefilter (ChunkIndex builds one for a CPU flat index of this many chunks)
    prefiltered = spec.kind == "flat" and not cindex.on_gpu and n >= PREFILTER_MIN_CHUNKS
    row = {
        "size": n,
        "index": spec.kind,
        "index_params": spec.params,
        "vectors": vectors,
        "command": command,
        "loadavg": {"size_start": load_start, "after_timing": load_timed, "size_end": [round(x, 2) for x in os.getloadavg()]},
        "kb": {"base_texts": b, "copies": -(-n // b), "texts_s": texts_s,
               "mean_chars": float(np.mean([len(t) for t in texts]))},
        "params": {m: {"k": params[m].k, "retrieval": params[m].retrieval, "candidates": params[m].candidates,
                       "lexical_weight": params[m].lexical_weight, "temperature": params[m].temperature,
                       "exact": params[m].exact} for m in MODES},
        "queries": len(qtexts),
        "rounds": rounds,
        "timed_s": timed_s,
        "modes": modes,
        "hybrid_minus_dense_p50_ms": delta,
        "hybrid_minus_dense_p50_cpu_ms": modes["hybrid"]["cpu_ms"]["p50"] - modes["dense"]["cpu_ms"]["p50"],
        "hybrid_minus_dense_paired_median_ms": statistics.median(paired),
        "hybrid_minus_dense_paired_median_cpu_ms": statistics.median(paired_cpu),
        "lexical_minus_dense_p50_cpu_ms": modes["lexical"]["cpu_ms"]["p50"] - modes["dense"]["cpu_ms"]["p50"],
        "lexical_minus_dense_p50_ms": modes["lexical"]["wall_ms"]["p50"] - modes["dense"]["wall_ms"]["p50"],
        "target_ms": TARGET_MS,
        "meets_target": {"wall_p50": delta <= TARGET_MS,
                         "cpu_p50": modes["hybrid"]["cpu_ms"]["p50"] - modes["dense"]["cpu_ms"]["p50"] <= TARGET_MS},
        "certification": cert,
        "flat_prefilter_during_timing": pf if any(pf.values()) else None,
        "exactness": exact,
        "stages": stages,
        "profile": prof,
        "lexical": {"build_s": lex_build_s, "bytes_on_disk": lex_bytes, "files": files,
                    "bytes_per_chunk": lex_bytes / n, "vocab": vocab, "postings": nnz,
                    "postings_per_chunk": nnz / n},
        "dense": {"index_build_s": index_build_s, "index_ready_s": index_ready_s,
                  "flat_bytes_per_chunk": flat_bytes / n, "index_file_bytes": index_file_bytes,
                  "index_file_bytes_per_chunk": index_file_bytes / n,
                  "prefilter_bytes_per_chunk": DIM if prefiltered else 0,
                  "embeddings_npy_bytes_per_chunk": DIM * 4},
        "kv_bytes_per_chunk_float32": {"quoted_docs_benchmarks_s6": KV_BYTES_PER_CHUNK_QUOTED,
                                       "formula_25x12x32x2x4": KV_BYTES_PER_CHUNK_FORMULA},
        "lexical_over_flat_bytes": lex_bytes / flat_bytes,
        "lexical_over_kv_bytes": (lex_bytes / n) / KV_BYTES_PER_CHUNK_QUOTED,
    }
    print(json.dumps({"size": n, "index": spec.kind,
                      **{m: {k: round(v, 3) for k, v in modes[m]["wall_ms"].items() if k in ("p50", "p90", "p99")}
                         for m in MODES},
                      "hybrid-dense p50": round(delta, 3),
                      "cpu p50 dense/hybrid/lexical": [round(modes[m]["cpu_ms"]["p50"], 3) for m in MODES],
                      "hybrid-dense cpu p50": round(row["hybrid_minus_dense_p50_cpu_ms"], 3),
                      "paired": round(row["hybrid_minus_dense_paired_median_ms"], 3),
                      "paired cpu": round(row["hybrid_minus_dense_paired_median_cpu_ms"], 3),
                      "lex B/chunk": round(lex_bytes / n, 1), "lex build s": round(lex_build_s, 1),
                      "certified": {m: round(cert[m]["rate"], 3) for m in cert},
                      "stages": {k: round(v, 3) for k, v in stages["hybrid_median_ms"].items()}}), flush=True)
    return row


def plot(name: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1.4, 1]})
    sizes = [r["size"] for r in rows]
    colors = {"dense": "#4C72B0", "hybrid": "#DD8452", "lexical": "#55A868"}
    for m in MODES:
        ax.plot(sizes, [r["modes"][m]["wall_ms"]["p50"] for r in rows], "o-", color=colors[m], label=f"{m} p50 wall")
        ax.plot(sizes, [r["modes"][m]["cpu_ms"]["p50"] for r in rows], "x:", color=colors[m], alpha=0.6,
                label=f"{m} p50 CPU")
    lines = [f"{r['size']:,} ({r['index']}): hybrid − dense {r['hybrid_minus_dense_p50_ms']:+.2f} ms wall, "
             f"{r['hybrid_minus_dense_p50_cpu_ms']:+.2f} CPU, paired median {r['hybrid_minus_dense_paired_median_ms']:+.2f} "
             f"wall / {r['hybrid_minus_dense_paired_median_cpu_ms']:+.2f} CPU"
             for r in rows]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", family="monospace")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log")
    ax.set_xlabel("KB chunks")
    ax.set_ylabel("retrieval stage, wall ms per query")
    ax.set_title(f"Engine.retrieve, one query, k=8, 1 thread, p50 (target: hybrid − dense ≤ {TARGET_MS:g} ms at 100k)",
                 fontsize=9)
    ax.legend(fontsize=6.5, ncol=2, loc="upper left")
    ax.grid(alpha=0.3)
    labels, vals, cols = [], [], []
    for r in rows:
        labels.append(f"lexical\n{r['size'] // 1000}k")
        vals.append(r["lexical"]["bytes_per_chunk"])
        cols.append(colors["lexical"])
    labels += ["FAISS flat\n(N·384·4)"]
    vals += [DIM * 4]
    cols += [colors["dense"]]
    for r in rows:
        if r["index"] != "flat":
            labels.append(f"FAISS {r['index']}\n{r['size'] // 1000}k")
            vals.append(r["dense"]["index_file_bytes_per_chunk"])
            cols.append("#8172B3")
    labels.append("K/V f32\n(§6)")
    vals.append(KV_BYTES_PER_CHUNK_QUOTED)
    cols.append("#C44E52")
    x = np.arange(len(vals))
    bx.bar(x, vals, color=cols)
    for i, v in enumerate(vals):
        bx.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    bx.set_yscale("log")
    bx.set_xticks(x, labels, fontsize=7)
    bx.set_ylabel("bytes per chunk (log)")
    bx.set_title("Index bytes per chunk: lexical (BM25 files) vs dense vs K/V", fontsize=9)
    fig.tight_layout(rect=(0, 0.03 + 0.025 * len(rows), 1, 1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200, help="timed queries per size (each runs every mode)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the queries")
    ap.add_argument("--vectors", choices=("real", "random"), default="real",
                    help="KB base vectors and query vectors: real embeddings (artifacts/eval) or seeded random")
    ap.add_argument("--index", default="auto", help="comma list of index kinds per size (auto: the service's choice)")
    ap.add_argument("--check", type=int, default=50, help="queries compared fast vs exact per size")
    ap.add_argument("--profile", action="store_true", help="cProfile the hybrid retrievals at every size")
    ap.add_argument("--name", default="hybrid_cost")
    ap.add_argument("--merge", action="store_true",
                    help="add this run's rows to NAME.json (a row of the same size and index is replaced)")
    ap.add_argument("--replot", action="store_true", help="only redraw NAME.png from NAME.json")


def run(args: argparse.Namespace) -> dict:
    if args.replot:
        res = json.loads((RESULTS / f"{args.name}.json").read_text())
        plot(args.name, res["rows"])
        return res
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load0 = [round(x, 2) for x in os.getloadavg()]
    command = "nice -n 5 " + args.command
    prev = None
    if args.merge:
        path = RESULTS / f"{args.name}.json"
        prev = json.loads(path.read_text()) if path.is_file() else None
        if prev is not None and "history" not in prev:
            raise SystemExit(f"--merge: {path} is from an older version of this bench; run without --merge")
    base = base_texts()
    base = (*base, real_base_vectors(base[1]) if args.vectors == "real" else None)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for kind in args.index.split(","):
            rows.append(run_size(n, kind, args.queries, args.rounds, args.check, base, args.vectors, args.profile,
                                 command))
    runs = [{"command": command, "loadavg_start": load0, "total_s": time.perf_counter() - t_start,
             "sizes": [r["size"] for r in rows]}]
    if prev is not None:
        new = {(r["size"], r["index"]) for r in rows}
        rows = sorted([r for r in prev["rows"] if (r["size"], r["index"]) not in new] + rows,
                      key=lambda r: (r["size"], r["index"]))
        runs = prev.get("runs", []) + runs
    versions = {}
    for mod in ("numpy", "faiss", "bm25s", "Stemmer"):
        try:
            versions[mod] = getattr(__import__(mod), "__version__", None)
        except ImportError:
            versions[mod] = None
    written = write(args.name, {
        "command": " && ".join(r["command"] for r in runs),  # with --merge: every run behind the rows
        "loadavg_start": runs[0]["loadavg_start"],
        "runs": runs,
        "nice": os.nice(0),
        "threads": {"torch": torch.get_num_threads(), "faiss": faiss.omp_get_max_threads()},
        "versions": versions,
        "total_s": sum(r["total_s"] for r in runs),
        "kb_construction": {
            "texts": "ObliQA passages (artifacts/eval/obliqa/kb.jsonl, Passage) + Banking77 train texts, "
                     f"shuffled with seed {SEED}; row i = copy i // B of base text i mod B; copy c ≥ 1: sentences "
                     "(split at . ! ? ; and newlines) in a seeded random order, one dropped when ≥ 3, then the "
                     "token 'copy<c>'",
            "embeddings": ("real all-MiniLM-L6-v2 embeddings per base text (artifacts/eval/bundles/{obliqa: the "
                           "passage's first chunk, banking77: the train row})" if args.vectors == "real" else
                           f"seeded random unit vectors (dim {DIM}) per base text")
                          + f"; copies: + N(0, {COPY_NOISE}²) per dimension, renormalised",
            "queries": "real texts: ObliQA validation questions and Banking77 test texts, half each, interleaved; "
                       + ("vectors: their real embeddings (artifacts/eval/hybrid_obliqa/qemb_*.npz, "
                          "artifacts/eval/hybrid_banking77/emb_test_*.npy)" if args.vectors == "real" else
                          f"vectors: a KB row holding the gold passage / a same-intent train text + N(0, {QUERY_NOISE}²) "
                          "per dimension, renormalised"),
        },
        "timed": "Engine.retrieve(xq[i:i+1], [InferParams(k=8, retrieval=mode) resolved], [text]), exact=False; "
                 "modes interleaved per query in rotating order; wall (perf_counter) and process CPU ms",
        "rows": rows,
        "history": HISTORY,
    })
    plot(args.name, rows)
    return written


if __name__ == "__main__":  # python -m bench hybrid_cost: the same as python -m bench hybrid_cost
    import sys

    from bench.__main__ import main

    main(["hybrid_cost", *sys.argv[1:]])
