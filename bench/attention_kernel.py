"""The decode graph's attention op alone: ONNX Runtime's GroupQueryAttention over an int8 cache (the default) and a float32 one, decode steps of 1/4/16 rows and prefills of 8/32/64 tokens, per row and per query token.

    python -m bench attention_kernel [--columns 890] [--rows 1,4,16] [--prefill 8,32,64] [--repeats 10]

The op as softknn.generate.graph builds it (qk_output on: the evidence trace), stacked for the 30
layers of SmolLM2-135M (9 query heads, 3 key/value heads, 64 dims), one thread, its cache bound as past
and present (the decode loop's IOBinding). Each row holds `--columns` columns before the new token
(890: k 8 of the sample KB, bench/results/profile_decode.json's memory_tokens_median plus a prompt).
The keys and values are random with the spread of real ones (int8 codes of std 32, scales that give
scores of std ~2): random codes at full scale make softmax underflow to subnormal floats, which
slows every kernel several-fold and measures nothing real.

Reported: ms per call (30 layers), ms per row (decode) and per query token (prefill), and for decode
the cache bytes read per ms (GB/s of the int8 or float32 buffer itself), and this process's peak
RSS. Writes bench/results/attention_kernel.json and .png.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

from bench.common import RESULTS, write

LAYERS, HEADS, KV_HEADS, DIM = 30, 9, 3, 64  # SmolLM2-135M


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--columns", type=int, default=890, help="cache columns of each row before the new tokens")
    ap.add_argument("--rows", default="1,4,16", help="decode steps (T = 1) of these many rows")
    ap.add_argument("--prefill", default="8,32,64", help="prefills (B = 1) of these many tokens")
    ap.add_argument("--repeats", type=int, default=10)


def _session(kv: str, T: str | int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    cache = TensorProto.INT8 if kv == "int8" else TensorProto.FLOAT
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, ["B", "T", HEADS * DIM]),
              helper.make_tensor_value_info("k", f, ["B", "T", KV_HEADS * DIM]),
              helper.make_tensor_value_info("v", f, ["B", "T", KV_HEADS * DIM]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total", TensorProto.INT32, []),
              helper.make_tensor_value_info("bias", f, ["B", 1, "T", "S"])]
    nodes, outputs, inits = [], [], []
    for li in range(LAYERS):
        inputs += [helper.make_tensor_value_info(f"past_{x}_{li}", cache, ["B", KV_HEADS, "C", DIM]) for x in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"o{li}", f, None), helper.make_tensor_value_info(f"qk{li}", f, None)]
        outputs += [helper.make_tensor_value_info(f"present_{x}_{li}", cache, None) for x in ("key", "value")]
        ins = ["q", "k", "v", f"past_key_{li}", f"past_value_{li}", "seqlens_k", "total", "", "", "", "bias"]
        quant = {}
        if kv == "int8":  # the scales of a real layer's spread: codes of std 32 → keys of std ~0.25
            for x in ("k", "v"):
                inits.append(helper.make_tensor(f"{x}s{li}", f, [KV_HEADS * DIM], np.full(KV_HEADS * DIM, 1 / 128, np.float32)))
            ins += ["", f"ks{li}", f"vs{li}"]
            quant = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}
        nodes.append(helper.make_node("GroupQueryAttention", ins, [f"o{li}", f"present_key_{li}", f"present_value_{li}", f"qk{li}"],
                                      domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, scale=1.0,
                                      qk_output=2, **quant))
    model = helper.make_model(helper.make_graph(nodes, "gqa", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _time(kv: str, B: int, T: int, columns: int, repeats: int, rng: np.random.Generator) -> float:
    """Median ms of one call of the 30 layers: B rows of `columns` past columns, T new tokens each."""
    import onnxruntime as ort

    sess = _session(kv, T)
    C = 128 * -(-(columns + T) // 128)
    S = columns + T
    feed = {"q": (rng.standard_normal((B, T, HEADS * DIM)) * 0.5).astype(np.float32),  # ·k of std 0.25: scores ~2
            "k": (rng.standard_normal((B, T, KV_HEADS * DIM)) * 0.25).astype(np.float32),
            "v": (rng.standard_normal((B, T, KV_HEADS * DIM)) * 0.25).astype(np.float32),
            "seqlens_k": np.full(B, S - 1, np.int32), "total": np.array(S, np.int32),
            "bias": np.zeros((B, 1, T, S), np.float32)}
    binding, keep = sess.io_binding(), []
    for name, a in feed.items():
        ov = ort.OrtValue.ortvalue_from_numpy(a)
        keep.append(ov)
        binding.bind_ortvalue_input(name, ov)
    for li in range(LAYERS):
        for x in ("key", "value"):
            codes = np.clip(np.rint(rng.standard_normal((B, KV_HEADS, C, DIM)) * 32), -127, 127)
            a = codes.astype(np.int8) if kv == "int8" else (codes / 128).astype(np.float32)
            ov = ort.OrtValue.ortvalue_from_numpy(a)
            keep.append(ov)
            binding.bind_ortvalue_input(f"past_{x}_{li}", ov)
            binding.bind_ortvalue_output(f"present_{x}_{li}", ov)
        binding.bind_output(f"o{li}", "cpu")
        binding.bind_output(f"qk{li}", "cpu")
    sess.run_with_iobinding(binding)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def run(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(0)
    rows = [int(x) for x in args.rows.split(",")]
    prefill = [int(x) for x in args.prefill.split(",")]
    out: dict = {"command": args.command, "columns": args.columns, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
                 "head_dim": DIM, "threads": 1, "by_cache": {}}
    for kv in ("int8", "fp32"):
        item = 1 if kv == "int8" else 4
        res: dict = {"decode": {}, "prefill": {}}
        for B in rows:
            ms = _time(kv, B, 1, args.columns, args.repeats, rng)
            read = B * LAYERS * 2 * KV_HEADS * (args.columns + 1) * DIM * item  # the rows' keys and values, once
            res["decode"][str(B)] = {"ms": round(ms, 2), "ms_per_row": round(ms / B, 3), "gb_per_s": round(read / ms / 1e6, 2)}
            print(kv, "decode", B, res["decode"][str(B)], flush=True)
        for T in prefill:
            ms = _time(kv, 1, T, args.columns, args.repeats, rng)
            res["prefill"][str(T)] = {"ms": round(ms, 2), "ms_per_token": round(ms / T, 3)}
            print(kv, "prefill", T, res["prefill"][str(T)], flush=True)
        out["by_cache"][kv] = res
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    payload = write("attention_kernel", out)
    plot(payload)
    return payload


def plot(payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for kv, res in payload["by_cache"].items():
        d, p = res["decode"], res["prefill"]
        a.plot([int(x) for x in d], [v["ms"] for v in d.values()], "o-", label=f"{kv} cache")
        b.plot([int(x) for x in p], [v["ms"] for v in p.values()], "o-", label=f"{kv} cache")
    a.set(xlabel="rows (decode step, T = 1)", ylabel="ms per call, 30 layers", title="decode: GroupQueryAttention")
    b.set(xlabel="prompt tokens (prefill, B = 1)", ylabel="ms per call, 30 layers", title="prefill: GroupQueryAttention")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{payload['columns']} past columns a row, one thread")
    fig.tight_layout()
    fig.savefig(RESULTS / "attention_kernel.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    main(["attention_kernel", *sys.argv[1:]])
