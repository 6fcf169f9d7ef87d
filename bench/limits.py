"""The machine's limits and how close encode and flat search come to them, measured in one run.

    python -m bench limits [--size 1000000] [--rounds 5]

Interleaved per round (load drift hits all alike), torch (and faiss) at --threads (0 = the cores):
    matmul      fp32 (2048×2048)·(2048×2048) with torch: FLOP/s = 2n³ / t
    bandwidth   read: sum of a 512 MiB fp32 tensor, bytes / t; copy: (read + write) bytes / t
    encode      SentenceTransformer.encode of 256 Banking77 texts, batch 32:
                FLOP/s ≈ 2 · params · tokens (the brief's estimate, every parameter) and
                ≈ 2 · non-embedding params · tokens (only the layers' matmuls; the embedding
                tables are look-ups) — tokens = the padded tokens the forward ran
    flat search one query against `size` chunk embeddings (float32, 384-d): ChunkIndex exact
                search (torch matmul + top-k, what softknn's flat path runs) and faiss
                IndexFlatIP; GB/s = N·D·4 / t
Needs `python -m bench kb` first for the embeddings (bench/kb.py: real up to ~46k, noisy
replicas beyond).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time

import faiss
import numpy as np
import torch

from bench.common import plot_bars, write
from bench.kb import set_threads


def clock(fn) -> tuple[float, float]:
    """(wall s, process CPU s) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def plot(res: dict) -> None:
    """Bars of the rates per second of CPU received (median, min–max over rounds): robust to a shared box."""
    cpu = res["raw_seconds"]["cpu"]
    work = {"matmul": 2 * 2048**3, "encode_all": 2 * res["encode"]["params"] * res["encode"]["padded_tokens"],
            "encode_ne": 2 * res["encode"]["non_embedding_params"] * res["encode"]["padded_tokens"],
            "read": 128 * 2**20 * 4, "search_torch": res["flat_search"]["bytes"], "search_faiss": res["flat_search"]["bytes"]}
    key = {"encode_all": "encode", "encode_ne": "encode"}
    vals, errs = [], []
    for k in ("matmul", "encode_all", "encode_ne", "read", "search_torch", "search_faiss"):
        r = [work[k] / max(x, 1e-9) / 1e9 for x in cpu[key.get(k, k)]]
        vals.append(statistics.median(r))
        errs.append((min(r), max(r)))
    labels = ["matmul\nGFLOP/s", "encode\nGFLOP/s\n(all params)", "encode\nGFLOP/s\n(non-emb.)", "read\nGB/s",
              "flat search\nGB/s\n(softknn)", "flat search\nGB/s\n(faiss)"]
    plot_bars("limits", labels, vals, errs, "per second of CPU (median, min–max)",
              f"Machine limits vs encode and flat search ({res['threads']} thread)")


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default: the cores)")
    ap.add_argument("--replot", action="store_true", help="only redraw limits.png from limits.json")


def run(args: argparse.Namespace) -> dict:
    if args.replot:
        from bench.common import RESULTS

        res = json.loads((RESULTS / "limits.json").read_text())
        plot(res)
        return res
    set_threads(args.threads)

    from bench.kb import CACHE, SHARED, device, embeddings
    from softknn.model.encoder import Encoder
    from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    big = torch.ones(128 * 2**20)  # 512 MiB
    dst = torch.empty_like(big)
    enc = Encoder(device=device())
    with open(SHARED / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)][:256]
    params = sum(p.numel() for p in enc.model.parameters())
    emb_params = sum(p.numel() for p in enc.model.embeddings.parameters())
    # the padded tokens the forward runs: ST sorts by length and pads each batch of 32 to its longest
    lengths = sorted(len(x) for x in enc.tokenizer(texts)["input_ids"])
    tokens = sum(max(lengths[i:i + 32]) * len(lengths[i:i + 32]) for i in range(0, len(lengths), 32))
    xb = embeddings(args.size)
    ci = ChunkIndex(faiss.IndexFlatIP(xb.shape[1]), xb, IndexSpec("flat", {}))
    fx = faiss.IndexFlatIP(xb.shape[1])
    fx.add(xb)
    xq = np.load(CACHE / "queries.npy")

    keys = ("matmul", "read", "copy", "encode", "search_torch", "search_faiss")
    t = {k: [] for k in keys}
    c = {k: [] for k in keys}
    faiss.omp_set_num_threads(torch.get_num_threads())
    enc.st.encode(texts[:32])
    for r in range(args.rounds):
        q = xq[r % len(xq)][None]
        fns = {"matmul": lambda: a @ b, "read": lambda: big.sum(), "copy": lambda: dst.copy_(big),
               "encode": lambda: enc.st.encode(texts, batch_size=32), "search_torch": lambda: ci.search(q, 8),  # noqa: B023
               "search_faiss": lambda: fx.search(q, 8)}  # noqa: B023 (each called in this iteration)
        for k in keys:
            w, cpu = clock(fns[k])
            t[k].append(w)
            c[k].append(cpu)

    def rate(work: float, key: str) -> dict:
        """work / wall s (median, min, max), and work / CPU s (median): one thread's rate, descheduling excluded."""
        v = [work / x for x in t[key]]
        return {"median": statistics.median(v), "min": min(v), "max": max(v),
                "per_cpu_second": statistics.median(work / max(x, 1e-9) for x in c[key])}

    xbytes = xb.nbytes
    res = {
        "threads": torch.get_num_threads(),
        "matmul_flops": rate(2 * n**3, "matmul"),
        "read_bytes_per_s": rate(big.numel() * 4, "read"),
        "copy_bytes_per_s": rate(2 * big.numel() * 4, "copy"),
        "encode": {"texts": len(texts), "padded_tokens": tokens, "params": params, "non_embedding_params": params - emb_params,
                   "flops_all_params": rate(2 * params * tokens, "encode"),
                   "flops_non_embedding": rate(2 * (params - emb_params) * tokens, "encode"),
                   "texts_per_s": rate(len(texts), "encode")},
        "flat_search": {"chunks": args.size, "bytes": xbytes, "torch_bytes_per_s": rate(xbytes, "search_torch"),
                        "faiss_bytes_per_s": rate(xbytes, "search_faiss"),
                        "torch_ms": statistics.median(t["search_torch"]) * 1e3,
                        "faiss_ms": statistics.median(t["search_faiss"]) * 1e3},
    }
    peak, bw = res["matmul_flops"]["median"], res["read_bytes_per_s"]["median"]
    res["fractions"] = {
        "encode_flops_all_params_of_matmul": res["encode"]["flops_all_params"]["median"] / peak,
        "encode_flops_non_embedding_of_matmul": res["encode"]["flops_non_embedding"]["median"] / peak,
        "flat_search_torch_of_read_bandwidth": res["flat_search"]["torch_bytes_per_s"]["median"] / bw,
        "flat_search_faiss_of_read_bandwidth": res["flat_search"]["faiss_bytes_per_s"]["median"] / bw,
    }
    threads = torch.get_num_threads()
    res["fractions_cpu_time"] = {  # with one thread: each rate per second of CPU actually received
        "encode_flops_all_params_of_matmul": res["encode"]["flops_all_params"]["per_cpu_second"] / res["matmul_flops"]["per_cpu_second"],
        "encode_flops_non_embedding_of_matmul": res["encode"]["flops_non_embedding"]["per_cpu_second"] / res["matmul_flops"]["per_cpu_second"],
        "flat_search_torch_of_read_bandwidth": res["flat_search"]["torch_bytes_per_s"]["per_cpu_second"] / res["read_bytes_per_s"]["per_cpu_second"],
        "flat_search_faiss_of_read_bandwidth": res["flat_search"]["faiss_bytes_per_s"]["per_cpu_second"] / res["read_bytes_per_s"]["per_cpu_second"],
        "valid": threads == 1,
    }
    res["raw_seconds"] = {"wall": t, "cpu": c}
    written = write("limits", {"command": f"python -m bench limits --size {args.size} --rounds {args.rounds} --threads {args.threads}", **res})
    plot(res)
    print(json.dumps({k: v for k, v in res.items() if k != "raw_seconds"}, indent=2))
    return written


if __name__ == "__main__":  # python -m bench limits: the same as python -m bench limits
    import sys

    from bench.__main__ import main

    main(["limits", *sys.argv[1:]])
