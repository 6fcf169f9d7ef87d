"""A request's memory made ready for the decode loop: R's chunks read from the generator store and laid
out as the int8 cache's columns, the way the server did it (decoded to float32 rows, then laid out) beside
the way it does now (laid out from the stored bytes in one pass, KVCache.layout_stored), per request at k = 8.

For each bundle (the sample KB with a float16 store, as gen_serving builds it; the ObliQA bundle, q4, where
`gen_build --kb obliqa` has built it) and each of the first QUESTIONS test questions, R's rows are retrieved
once; then, alternating the two ways question by question, each is timed cold (the store's float LRU and the
loop's laid LRU emptied: the chunks are read from the memory-mapped store, whose pages the OS keeps) and
warm (the same request again: its chunks in that way's LRU). `float`: GeneratorStore.chunks (decode_chunk
into float32 rows, kept in the store's LRU) + pack_chunks + KVCache.layout (the kernel's one pass over the
float rows); `laid`: KVCache.layout_stored. Both give the same bytes (tests/core/test_decode_kernel.py,
tests/service/test_generate.py). Medians of ms per request; the bytes each LRU keeps per chunk token.

    python -m bench chunk_layout [--questions 16] [--k 8]

→ bench/results/chunk_layout.json and chunk_layout.png, with this process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from bench.common import plot_bars, speed_probe, write

ROOT = Path(__file__).resolve().parents[1]


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)


def _measure(ge, qs: list[dict], k: int) -> dict:
    import torch

    from bench.generation import msgs
    from softknn.generate.batch import pack_chunks
    from softknn.generate.engine import GenParams

    store = ge.store
    cache = ge.decode_loop().cache
    if not cache.lays_stored(store.kind):
        return {"skipped": f"the decode loop's cache does not lay out a {store.kind} store from its bytes"}
    p = ge.resolve(GenParams(k=k))
    prefix = ge.generator.layout(None, msgs(qs[0]["question"]))[0]
    requests = []
    for q in qs:
        retr = ge.retrieve(q["question"], p)
        requests.append((retr.rows[0], torch.tensor(retr.weights[0])))

    def as_float(rows, w):
        kvs = store.chunks(rows, ge._recompute)
        packed = pack_chunks([c.kv for c in kvs], ge.layers, w, p.prior, p.positions, ge.generator.inv_freq,
                             encoded_after=store.prefix_len, prefix_len=len(prefix), extents=[c.extent for c in kvs])
        return cache.layout(packed)

    def as_laid(rows, w):
        return cache.layout_stored(store, rows)

    ways = {"float": as_float, "laid": as_laid}
    ms: dict[str, dict[str, list[float]]] = {w: {"cold": [], "warm": []} for w in ways}
    tokens = []
    for i, (rows, w) in enumerate(requests):
        order = list(ways) if i % 2 == 0 else list(ways)[::-1]
        for way in order:
            store.clear()
            cache.clear_laid()
            for state in ("cold", "warm"):
                t0 = time.perf_counter()
                ways[way](rows, w)
                ms[way][state].append((time.perf_counter() - t0) * 1e3)
        tokens.append(sum(store.placed_as(r)[0] for r in rows))
    L, nkv, hs = len(ge.layers), cache.nkv, cache.hs
    return {
        "store": store.kind, "k": k, "requests": len(requests), "memory_tokens_median": statistics.median(tokens),
        "ms_per_request": {w: {s: round(statistics.median(v), 2) for s, v in d.items()} for w, d in ms.items()},
        "cold_speedup": round(statistics.median(ms["float"]["cold"]) / statistics.median(ms["laid"]["cold"]), 2),
        "lru_bytes_per_token": {"float": L * 2 * nkv * hs * 4, "laid": L * 2 * nkv * hs},
        "lru_capacity_bytes": {"float": store.cache_bytes, "laid": cache.laid_cache_bytes},
    }


def run(args: argparse.Namespace) -> dict:
    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models, setup_threads
    from softknn.storage.bundle import load_bundle

    setup_threads()
    probe = {"start": speed_probe()}
    enc, gen = models()
    qs = [q for q in load_qa() if q.get("split") == "test"][: args.questions] or load_qa()[: args.questions]
    bundle, _ = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    out: dict[str, dict] = {}
    out["sample_fp16"] = _measure(gen_engine(enc, gen, bundle), qs, args.k)
    print("sample_fp16", out["sample_fp16"], flush=True)
    obliqa = CACHE / "gen-build-obliqa"
    if (obliqa / "manifest.json").exists():
        import json

        from bench.gen_quality import QA_OBLIQA

        oq = [json.loads(x) for x in QA_OBLIQA.read_text().splitlines() if x.strip()]
        ob = load_bundle(obliqa, expected_fingerprint=enc.info.fingerprint)
        out["obliqa_q4"] = _measure(gen_engine(enc, gen, ob), oq[: args.questions], args.k)
        print("obliqa_q4", out["obliqa_q4"], flush=True)
    else:
        out["obliqa_q4"] = {"skipped": f"{obliqa} absent: python -m bench gen_build --kb obliqa builds it"}
    probe["end"] = speed_probe()
    labels, values = [], []
    for r in out.values():
        for way in ("float", "laid"):
            for state in ("cold", "warm"):
                if "ms_per_request" in r:
                    labels.append(f"{r['store']}\n{way}\n{state}")
                    values.append(r["ms_per_request"][way][state])
    if labels:
        plot_bars("chunk_layout", labels, values, None, "ms per request (k 8)",
                  "R as int8 cache columns: float rows + layout vs laid from the store")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return write("chunk_layout", {"command": f"python -m bench chunk_layout --questions {args.questions} --k {args.k}",
                                  "speed_probe": probe, **out, "peak_rss": {"self_mb": round(peak, 1)}})
