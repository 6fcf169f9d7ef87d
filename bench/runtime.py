"""The model runtime side by side: torch eager vs ONNX Runtime, same run, one thread.

    python -m bench runtime [--texts 256] [--repeats 5] [--build-limit 2000] [--quality] [--name runtime]
                            [--baseline REV] [--variants onnx,onnx-extended,onnx-int8]

1. Plain forward (`Encoder.forward_plain`: tokens in, pooled normalised embedding out) on Banking77
   test texts, batch 1 and batch 8, for torch, onnx fp32 (graph optimisation "all" and "extended")
   and onnx int8. The alternatives run interleaved (a, b, c, … per repeat) so drifting load hits them
   alike; each reports wall and process-CPU seconds (one thread: CPU time is the work itself, wall
   time also counts time descheduled on the shared box). Max |Δ| of the embeddings and the last
   hidden state (at real, non-padded positions) to torch's over every text.
2. Builder throughput: `build_bundle` on the first --build-limit Banking77 train texts, torch vs
   onnx fp32, interleaved.
3. --quality: the int8 cost at the embedding level, fp32 (onnx, = torch within 1e-4) vs int8 in the
   same run: Banking77 test accuracy of the weighted k-NN (k 8, softmax τ 0.05) over train
   embeddings, and ObliQA validation-question dense retrieval nDCG@10 over the ObliQA KB passages.
--baseline REV adds `onnx-REV`: the fp32 export of `softknn/model/onnx_forward.py` as it was at git
revision REV (its own cache file name, its own verification), in the same interleaved runs and in the
builder comparison: old vs new export measured together. --variants picks the onnx alternatives.
Writes bench/results/<name>.json and <name>.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import RESULTS, result_path, write

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]


def _interleaved(fns: dict, repeats: int) -> dict:
    """Each alternative `repeats` times, round-robin; median/min of wall and CPU seconds."""
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: {"median_s": statistics.median(wall[k]), "min_s": min(wall[k]), "runs": wall[k],
                "cpu_median_s": statistics.median(cpu[k]), "cpu_min_s": min(cpu[k])} for k in fns}


def _banking(split: str) -> tuple[list[str], list[str]]:
    with open(SHARED / "banking77" / f"{split}.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["category"] for r in rows]


def _embed(enc, texts: list[str], bs: int = 32) -> np.ndarray:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths together: less padding
    out = np.zeros((len(texts), enc.info.dim), dtype=np.float32)
    for s in range(0, len(order), bs):
        rows = order[s:s + bs]
        out[rows] = enc.forward_plain(enc.tokenize([texts[i] for i in rows], truncate=True)).embedding.numpy()
    return out


def forward(encs: dict, texts: list[str], repeats: int) -> dict:
    ref = encs["torch"]
    res = {}
    for B in (1, 8):
        batches = [ref.tokenize(texts[i:i + B]) for i in range(0, len(texts), B)]
        fns = {k: (lambda e=e, bs=batches: [e.forward_plain(b) for b in bs]) for k, e in encs.items()}
        for fn in fns.values():
            fn()  # warm-up
        t = _interleaved(fns, repeats)
        diffs = {k: {"embedding": 0.0, "last_hidden": 0.0} for k in encs}
        for b in batches:
            r = ref.forward_plain(b)
            for k, e in encs.items():
                g = e.forward_plain(b)
                diffs[k]["embedding"] = max(diffs[k]["embedding"], float((g.embedding - r.embedding).abs().max()))
                real = b.mask[:, :, None]  # the packed onnx graph leaves padded positions zero (no caller reads them)
                diffs[k]["last_hidden"] = max(diffs[k]["last_hidden"], float(
                    (g.token_embeddings - r.token_embeddings).abs().masked_fill(~real, 0).max()))
        res[f"b{B}"] = {k: {**t[k], "ms_per_text": 1e3 * t[k]["median_s"] / len(texts),
                            "cpu_ms_per_text": 1e3 * t[k]["cpu_median_s"] / len(texts),
                            "speedup_wall": t["torch"]["median_s"] / t[k]["median_s"],
                            "speedup_cpu": t["torch"]["cpu_median_s"] / t[k]["cpu_median_s"],
                            "max_abs_diff": diffs[k]} for k in encs}
        print(B, {k: (round(v["speedup_wall"], 2), round(v["speedup_cpu"], 2)) for k, v in res[f"b{B}"].items()},
              flush=True)
    return res


def builder(encs: dict, limit: int, repeats: int) -> dict:
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    texts, labels = _banking("train")
    tmp = Path(tempfile.mkdtemp(prefix="softknn-bench-runtime-"))
    try:
        kb = tmp / "b77.jsonl"
        kb.write_text("".join(json.dumps({"id": f"t{i}", "text": t, "label": lab}) + "\n"
                              for i, (t, lab) in enumerate(zip(texts[:limit], labels[:limit], strict=True))))
        fns = {k: (lambda e=e, k=k: build_bundle(kb, tmp / k, BuildConfig(), e, force=True, progress=False))
               for k, e in encs.items()}
        t = _interleaved(fns, repeats)
        n = len(texts[:limit])
        return {"texts": n, **{k: {**v, "texts_per_s": n / v["median_s"], "texts_per_cpu_s": n / v["cpu_median_s"],
                                   "speedup_wall": t["torch"]["median_s"] / v["median_s"],
                                   "speedup_cpu": t["torch"]["cpu_median_s"] / v["cpu_median_s"]}
                                for k, v in t.items()}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _knn_accuracy(xq, xb, yq, yb, k=8, tau=0.05) -> float:
    s = torch.from_numpy(xq) @ torch.from_numpy(xb).T  # (nq, nb) cosine
    D, I = s.topk(k, dim=1)
    w = torch.softmax(D / tau, dim=1)
    hits = 0
    for i in range(len(yq)):
        acc: dict[str, float] = {}
        for j, x in zip(I[i].tolist(), w[i].tolist(), strict=True):
            acc[yb[j]] = acc.get(yb[j], 0.0) + x
        hits += max(acc.items(), key=lambda kv: (kv[1], kv[0]))[0] == yq[i]
    return hits / len(yq)


def _ndcg10(xq, xb, ids, gold: list[set[str]]) -> float:
    I = (torch.from_numpy(xq) @ torch.from_numpy(xb).T).topk(10, dim=1).indices.tolist()
    total = 0.0
    for row, g in zip(I, gold, strict=True):
        dcg = sum(1 / math.log2(r + 2) for r, j in enumerate(row) if ids[j] in g)
        idcg = sum(1 / math.log2(r + 2) for r in range(min(len(g), 10)))
        total += dcg / idcg
    return total / len(gold)


def quality(encs: dict, every: int, distractors: int) -> dict:
    """Subsets (time on the shared box): every `every`-th Banking77 train and test text; the ObliQA KB
    cut to the val questions' gold passages plus its first `distractors` other passages."""
    tr, ytr = (x[::every] for x in _banking("train"))
    te, yte = (x[::every] for x in _banking("test"))
    kb = [json.loads(x) for x in (REPO / "artifacts-main" / "eval" / "obliqa" / "kb.jsonl").read_text().splitlines()]
    qs = [json.loads(x) for x in (REPO / "artifacts-main" / "eval" / "obliqa" / "questions_val.jsonl").read_text().splitlines()]
    gold = {g for q in qs for g in q["gold_ids"]}
    kb = [r for r in kb if r["ID"] in gold] + [r for r in kb if r["ID"] not in gold][:distractors]
    out = {}
    for k, e in encs.items():
        t0 = time.perf_counter()
        acc = _knn_accuracy(_embed(e, te), _embed(e, tr), yte, ytr)
        xb = _embed(e, [r["Passage"] for r in kb])
        nd = _ndcg10(_embed(e, [q["text"] for q in qs]), xb, [r["ID"] for r in kb], [set(q["gold_ids"]) for q in qs])
        out[k] = {"banking77_test_knn_accuracy": acc, "obliqa_val_dense_ndcg10": nd, "seconds": time.perf_counter() - t0}
        print(k, out[k], flush=True)
    return {"setup": {"banking77": f"every {every}th text: {len(te)} test texts, weighted k-NN (k 8, softmax τ 0.05) over {len(tr)} train",
                      "obliqa": f"{len(qs)} validation questions, dense top-10 over {len(kb)} KB passages "
                                f"(their {len(gold)} gold passages + the KB's first {distractors} others)"}, **out}


def plot(name: str, res: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = [("plain b1", res["forward"]["b1"]), ("plain b8", res["forward"]["b8"])]
    if "builder" in res:
        groups.append(("builder", {k: v for k, v in res["builder"].items() if isinstance(v, dict)}))
    keys = list(res["forward"]["b1"])
    for ax, metric, title in ((axes[0], "speedup_wall", "wall"), (axes[1], "speedup_cpu", "process CPU")):
        for j, k in enumerate(keys):
            xs = [i + j * 0.8 / len(keys) for i in range(len(groups))]
            ys = [g[k][metric] if k in g else 0 for _, g in groups]
            ax.bar(xs, ys, width=0.8 / len(keys), label=k)
            for x, y in zip(xs, ys, strict=True):
                if y:
                    ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([i + 0.4 - 0.4 / len(keys) for i in range(len(groups))], [g for g, _ in groups])
        ax.set_ylabel(f"speed-up over torch eager ({title} time)")
        ax.set_title(f"1 thread, Banking77 texts: {title}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def baseline_forward(rev: str):
    """softknn/model/onnx_forward.py at git revision `rev`, loaded as a module of its own."""
    import importlib.util
    import subprocess
    import sys

    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:softknn/model/onnx_forward.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="softknn-onnx-baseline-")) / f"onnx_forward_{rev}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"onnx_forward_{rev}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--build-limit", type=int, default=2000, help="Banking77 train texts the builder runs over (0 = skip)")
    ap.add_argument("--build-repeats", type=int, default=2)
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--quality-every", type=int, default=3, help="--quality: every n-th Banking77 text")
    ap.add_argument("--quality-distractors", type=int, default=2000, help="--quality: ObliQA non-gold passages")
    ap.add_argument("--cache", type=Path, default=None, help="ONNX export cache (default the settings' default)")
    ap.add_argument("--name", default="runtime")
    ap.add_argument("--baseline", default=None, help="also run onnx_forward.py as at this git revision (onnx-REV)")
    ap.add_argument("--variants", default="onnx,onnx-extended,onnx-int8", help="onnx alternatives, comma-separated")


def run(args: argparse.Namespace) -> dict:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    from softknn.model.encoder import Encoder

    t0 = time.perf_counter()
    encs = {"torch": Encoder()}
    kw = {"runtime": "onnx", "onnx_cache": args.cache, "threads": 1}
    variants = args.variants.split(",")
    encs["onnx"] = Encoder(**kw)  # the builder's and --quality's fp32 reference: always
    if "onnx-extended" in variants:
        encs["onnx-extended"] = Encoder(**kw, onnx_optimization="extended")
    if "onnx-int8" in variants:
        encs["onnx-int8"] = Encoder(**kw, precision="int8")
    if args.baseline:  # the same Encoder, its onnx forward swapped for the old module's
        old = Encoder()
        old.info.runtime = "onnx"
        mod = baseline_forward(args.baseline)
        cache = (args.cache or mod.default_cache_dir()) / f"baseline-{args.baseline}"
        old.onnx = mod.OnnxForward(old, cache_dir=cache, threads=1)
        encs[f"onnx-{args.baseline}"] = old
    verification = {k: e.onnx.verification for k, e in encs.items() if e.onnx is not None}
    load_s = time.perf_counter() - t0
    texts = _banking("test")[0][: args.texts]
    res = {"setup": {"threads": 1, "texts": len(texts), "source": "Banking77 test.csv, first texts",
                     "repeats": args.repeats, "encoders_load_s": load_s, "baseline": args.baseline},
           "verification": verification, "forward": forward(encs, texts, args.repeats)}
    if args.build_limit:
        res["builder"] = builder({k: e for k, e in encs.items() if k in ("torch", "onnx", f"onnx-{args.baseline}")},
                                 args.build_limit, args.build_repeats)
        print("builder", {k: round(v["speedup_wall"], 2) for k, v in res["builder"].items() if isinstance(v, dict)})
    if args.quality:
        res["quality"] = quality({"onnx": encs["onnx"], "onnx-int8": encs["onnx-int8"]}, args.quality_every,
                                 args.quality_distractors)
    res["load_average_after"] = os.getloadavg()
    written = write(args.name, res)
    print(result_path(args.name), plot(args.name, res))
    return written


if __name__ == "__main__":  # python -m bench runtime: the same as python -m bench runtime
    import sys

    from bench.__main__ import main

    main(["runtime", *sys.argv[1:]])
