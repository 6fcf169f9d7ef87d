"""Model runtime: how far ONNX Runtime fp32 `exact: true` answers are from torch's, to the last bit.

On the sample KB (`softknn sample-kb`), built once with torch and once with onnx fp32 (the production
builder's defaults), `Engine.infer` answers with exact=True for TEXTS (sample queries, out-of-domain
queries and hand-made edge cases) under PARAMS (the defaults = fixed α 0.7 hybrid, joint mixing,
dense, α 0.4, k 16) are compared against the reference (torch, 1 thread, torch-built bundle, one text
per call), per arm:

  - torch-2threads / torch-batched: torch itself at another thread count / all texts in one call
    (the floor: how much torch moves against itself);
  - onnx-{all,basic}: onnx fp32 at ORT graph optimisation all (the default) / basic, torch-built bundle;
  - onnx-built: onnx fp32 (all) on the bundle built by onnx fp32, one text per call;

and reports max |Δ| of the fused embedding (per answer; max, percentiles, how many above 1e-7 and
1e-6), of every other float in the answer, and whether labels / evidence ids / ranks agree.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench runtime_exact     # writes bench/results/runtime_exact.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.common import result_path, write
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.model.encoder import Encoder
from softknn.storage.bundle import load_bundle

SAMPLE = Path(__file__).resolve().parents[1] / "softknn" / "sample_kb"
EDGE = ["?", "refund", "DOG", "ferry ferry ferry ferry ferry ferry", "Zürich → Köln: 12,50 € 🚆 déjà-vu",
        "渡轮几点开？", "can i bring my 2 cats + 1 parrot (in a cage) on the 07:45 to saltbridge???",
        "SELECT * FROM tickets WHERE price < 10;",
        " ".join(["The ferry was late again and nobody told us why, which is why I want a refund."] * 25),  # > 256 tokens
        "what is the exchange rate of the euro"]
PARAMS = {"default": {}, "joint": {"mixing": "joint"}, "dense": {"retrieval": "dense"}, "alpha0.4": {"alpha": 0.4},
          "k16": {"k": 16}}
THRESHOLDS = (1e-7, 1e-6, 1e-5)


def texts() -> list[str]:
    q = [json.loads(x)["text"] for x in (SAMPLE / "queries.jsonl").read_text().splitlines() if x.strip()]
    ood = [json.loads(x)["text"] for x in (SAMPLE / "ood_queries.jsonl").read_text().splitlines() if x.strip()]
    return q[::4] + ood[::4] + EDGE  # 15 + 5 + 10


def floats(a, b, out: list[float], mism: list[str], path: str = "") -> None:
    """Every float of answer a against b (|Δ| appended; the embedding excluded), non-floats compared."""
    if isinstance(a, dict):
        if a.keys() != b.keys():
            mism.append(f"{path}: keys")
            return
        for k in a:
            if not (path == "" and k == "embedding"):
                floats(a[k], b[k], out, mism, f"{path}.{k}")
    elif isinstance(a, list | tuple):
        if len(a) != len(b):
            mism.append(f"{path}: length")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            floats(x, y, out, mism, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        out.append(abs(a - b))
    elif a != b:
        mism.append(path)


def answers(engine: Engine, ts: list[str], params: InferParams, batched: bool) -> list[dict]:
    """The answers' JSON views (InferResult.to_dict), so every float in them can be compared."""
    res = engine.infer(ts, [params] * len(ts)) if batched else [engine.infer([t], [params])[0] for t in ts]
    return [r.to_dict() for r in res]


def compare(ref: list[dict], got: list[dict]) -> dict:
    emb = np.array([np.abs(np.asarray(g["embedding"], np.float64) - np.asarray(r["embedding"], np.float64)).max()
                    for g, r in zip(got, ref, strict=True)])
    other, mism = [], []
    for g, r in zip(got, ref, strict=True):
        floats(g, r, other, mism)
    return {"embedding_per_answer": emb.tolist(), "other_floats_max": max(other) if other else 0.0,
            "mismatches": mism}


def summary(per: list[float]) -> dict:
    a = np.array(per)
    return {"n": len(a), "max": float(a.max()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "zero": int((a == 0).sum()),
            **{f"above_{t:g}": int((a > t).sum()) for t in THRESHOLDS}}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    """No flags: the sample KB, five parameter sets, one thread."""


def run(args: argparse.Namespace) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    ts = texts()
    work = Path(tempfile.mkdtemp(prefix="softknn-runtime-exact-"))
    torch_enc = Encoder(threads=1)
    onnx_all = Encoder(runtime="onnx", threads=1)
    onnx_basic = Encoder(runtime="onnx", threads=1, onnx_optimization="basic")  # the same cached graph
    kb = SAMPLE / "kb"
    build_bundle(kb, work / "torch", BuildConfig(), torch_enc, progress=False)
    build_bundle(kb, work / "onnx", BuildConfig(), onnx_all, progress=False)
    b_torch, b_onnx = load_bundle(work / "torch"), load_bundle(work / "onnx")
    ref_engine = Engine(torch_enc, b_torch)
    arms = {"torch-2threads": (Engine(torch_enc, b_torch), False, 2),
            "torch-batched": (ref_engine, True, 1),
            "onnx-all": (Engine(onnx_all, b_torch), False, 1),
            "onnx-all-batched": (Engine(onnx_all, b_torch), True, 1),
            "onnx-basic": (Engine(onnx_basic, b_torch), False, 1),
            "onnx-built": (Engine(onnx_all, b_onnx), False, 1)}
    res = {"command": "HF_HUB_OFFLINE=1 .venv/bin/" + args.command, "texts": ts, "params": PARAMS,
           "reference": "torch fp32, 1 thread, torch-built sample bundle, one text per Engine.infer call, exact=True",
           "verification": {"all": onnx_all.onnx.verification, "basic": onnx_basic.onnx.verification},
           "arms": {}}
    per_arm: dict[str, dict] = {a: {} for a in arms}
    for pname, kw in PARAMS.items():
        p = InferParams(exact=True, truncate=True, **kw)
        torch.set_num_threads(1)
        ref = answers(ref_engine, ts, p, False)
        for arm, (eng, batched, threads) in arms.items():
            torch.set_num_threads(threads)
            per_arm[arm][pname] = compare(ref, answers(eng, ts, p, batched))
        torch.set_num_threads(1)
    for arm, by in per_arm.items():
        every = [d for v in by.values() for d in v["embedding_per_answer"]]
        res["arms"][arm] = {"embedding": summary(every),
                            "by_params": {p: {"embedding_max": max(v["embedding_per_answer"]),
                                              "other_floats_max": v["other_floats_max"],
                                              "mismatches": v["mismatches"][:10], "n_mismatches": len(v["mismatches"])}
                                          for p, v in by.items()},
                            "other_floats_max": max(v["other_floats_max"] for v in by.values()),
                            "n_mismatches": sum(len(v["mismatches"]) for v in by.values()),
                            "per_answer": {p: v["embedding_per_answer"] for p, v in by.items()}}
        print(arm, json.dumps({k: res["arms"][arm][k] for k in ("embedding", "other_floats_max", "n_mismatches")}),
              flush=True)
    written = write("runtime_exact", res)
    print(f"wrote {result_path('runtime_exact')}")
    return written


if __name__ == "__main__":  # python -m bench runtime_exact: the same as python -m bench runtime_exact
    import sys

    from bench.__main__ import main

    main(["runtime_exact", *sys.argv[1:]])
