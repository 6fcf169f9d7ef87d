"""The decode graph's attention alone: ONNX Runtime's GroupQueryAttention over an int8 cache and a float32 one, and softknn's C kernel over the int8 cache, decode steps of 1/4/16 rows and prefills of 8/32/64 tokens, per row and per query token.

    python -m bench attention_kernel [--columns 890] [--rows 1,4,16] [--prefill 8,32,64] [--repeats 10]
        [--against REV] [--kernels-only] [--name attention_kernel]

The op as softknn.generate.graph builds it (qk_output on: the evidence trace), stacked for the 30
layers of SmolLM2-135M (9 query heads, 3 key/value heads, 64 dims), one thread, its cache bound as past
and present (the decode loop's IOBinding). Each row holds `--columns` columns before the new token
(890: k 8 of the sample KB, bench/results/profile_decode.json's memory_tokens_median plus a prompt).
The keys and values are random with the spread of real ones (int8 codes of std 32, scales that give
scores of std ~2): random codes at full scale make softmax underflow to subnormal floats, which
slows every kernel several-fold and measures nothing real.

Beside it, `matmul_integer_decode`: the memory part of a decode step in standard operators
(MatMulInteger over int8 keys stored transposed and int8 values, the probabilities in two 8-bit
planes), a lower bound of what a graph without GroupQueryAttention would cost.

And `kernel`: softknn's own attention kernel (softknn/generate/attend.c through softknn.generate.kernel,
what the server runs between the decode graph's segments: generator.attention), built here as the
server builds it (AVX-512 intrinsics where the CPU has them), and `kernel_generic`, its plain C loops,
on the same decode rows and prefills, with their largest difference from the float64 reference
(skipped, saying so, without a C compiler); and `kernel_threads`, the kernel as the server calls it, its
rows' kv heads and prefill tokens shared among `--threads` threads (default: this machine's cores;
generator.attention_threads). With `--against REV`, attend.c as it was at git revision REV is built too
and timed beside `kernel` and `kernel_threads`, alternating with them on the same inputs within each
repeat (`kernel_against`, `kernel_threads_against`): a change to the kernel measured side by side, in one
run. `--kernels-only` leaves out ONNX Runtime's ops (a kernel change's A/B in a minute or two).

Reported: ms per call (30 layers), ms per row (decode) and per query token (prefill), and for decode
the cache bytes read per ms (GB/s of the int8 or float32 buffer itself), and this process's peak
RSS. Writes bench/results/attention_kernel.json and .png.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, write

LAYERS, HEADS, KV_HEADS, DIM = 30, 9, 3, 64  # SmolLM2-135M


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--columns", type=int, default=890, help="cache columns of each row before the new tokens")
    ap.add_argument("--rows", default="1,4,16", help="decode steps (T = 1) of these many rows")
    ap.add_argument("--prefill", default="8,32,64", help="prefills (B = 1) of these many tokens")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="threads of `kernel_threads` (0 = cores)")
    ap.add_argument("--against", default="", help="git revision: its attend.c built too and timed alternating "
                    "with this one's (kernel_against, kernel_threads_against)")
    ap.add_argument("--kernels-only", action="store_true", help="only the kernel builds (no ONNX Runtime ops)")
    ap.add_argument("--name", default="attention_kernel", help="bench/results/NAME.json and .png")


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


def _matmul_integer_ms(B: int, columns: int, repeats: int, rng: np.random.Generator) -> float:
    """The memory part of a decode step in standard ONNX operators, for comparison: per layer and kv
    head, q (the group's 3 query heads, times the key scales) rounded to uint8 per row, MatMulInteger
    with the int8 keys stored transposed, softmax, the probabilities in two uint8 planes (p·255 and its
    remainder·255) through MatMulInteger with the int8 values. No own tokens, no cache append: a lower
    bound of what such a graph would cost."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    G = HEADS // KV_HEADS
    nodes, inits = [], []

    def const(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(a, name))
        return name

    def op(kind: str, ins: list[str], out: str, **kw) -> str:
        nodes.append(helper.make_node(kind, ins, [out], **kw))
        return out

    for name, v, dt in (("zp128", 128, np.uint8), ("zu", 0, np.uint8), ("zs", 0, np.int8), ("f255", 255.0, np.float32),
                        ("f127", 127.0, np.float32), ("f128", 128.0, np.float32), ("i255", 1 / 255, np.float32),
                        ("i65025", 1 / 65025, np.float32), ("eps", 1e-12, np.float32)):
        const(name, np.array(v, dtype=dt))
    const("last", np.array([-1], dtype=np.int64))
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", KV_HEADS, G, DIM]),
              helper.make_tensor_value_info("mbias", TensorProto.FLOAT, ["B", 1, 1, "M"])]
    outputs = []
    for li in range(LAYERS):
        inputs += [helper.make_tensor_value_info(f"kt_{li}", TensorProto.INT8, ["B", KV_HEADS, DIM, "M"]),
                   helper.make_tensor_value_info(f"v_{li}", TensorProto.INT8, ["B", KV_HEADS, "M", DIM])]
        ks = const(f"ks_{li}", np.full((KV_HEADS, 1, DIM), 1 / 128, np.float32))
        vs = const(f"vs_{li}", np.full((KV_HEADS, 1, DIM), 1 / 128, np.float32))
        qs = op("Mul", ["q", ks], f"qs_{li}")
        sq = op("Div", [op("Max", [op("ReduceMax", [op("Abs", [qs], f"qa_{li}"), "last"], f"qm_{li}", keepdims=1), "eps"],
                           f"qx_{li}"), "f127"], f"sq_{li}")
        qu = op("Cast", [op("Add", [op("Round", [op("Div", [qs, sq], f"qd_{li}")], f"qr_{li}"), "f128"], f"qo_{li}")],
                f"qu_{li}", to=TensorProto.UINT8)
        sc = op("Add", [op("Mul", [op("Cast", [op("MatMulInteger", [qu, f"kt_{li}", "zp128", "zs"], f"si_{li}")], f"sf_{li}",
                                      to=TensorProto.FLOAT), sq], f"ss_{li}"), "mbias"], f"sc_{li}")
        e = op("Exp", [op("Sub", [sc, op("ReduceMax", [sc, "last"], f"mx_{li}", keepdims=1)], f"sm_{li}")], f"e_{li}")
        z = op("ReduceSum", [e, "last"], f"z_{li}", keepdims=1)
        p255 = op("Mul", [e, "f255"], f"p_{li}")
        r1 = op("Round", [p255], f"r1_{li}")
        u1 = op("Cast", [r1], f"u1_{li}", to=TensorProto.UINT8)
        u2 = op("Cast", [op("Add", [op("Round", [op("Mul", [op("Sub", [p255, r1], f"d_{li}"), "f255"], f"d2_{li}")], f"r2_{li}"),
                                    "f128"], f"r3_{li}")], f"u2_{li}", to=TensorProto.UINT8)
        o1 = op("Mul", [op("Cast", [op("MatMulInteger", [u1, f"v_{li}", "zu", "zs"], f"o1_{li}")], f"o1f_{li}", to=TensorProto.FLOAT), "i255"], f"o1s_{li}")
        o2 = op("Mul", [op("Cast", [op("MatMulInteger", [u2, f"v_{li}", "zp128", "zs"], f"o2_{li}")], f"o2f_{li}", to=TensorProto.FLOAT), "i65025"], f"o2s_{li}")
        out = op("Div", [op("Mul", [op("Add", [o1, o2], f"o_{li}"), vs], f"ov_{li}"), z], f"out_{li}")
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "memattn", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 18)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = 1, 1, 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"q": (rng.standard_normal((B, KV_HEADS, G, DIM)) * 0.5).astype(np.float32),
            "mbias": np.zeros((B, 1, 1, columns), np.float32)}
    for li in range(LAYERS):
        feed[f"kt_{li}"] = np.clip(np.rint(rng.standard_normal((B, KV_HEADS, DIM, columns)) * 32), -127, 127).astype(np.int8)
        feed[f"v_{li}"] = np.clip(np.rint(rng.standard_normal((B, KV_HEADS, columns, DIM)) * 32), -127, 127).astype(np.int8)
    sess.run(None, feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _kernels_ms(kerns: dict, B: int, T: int, columns: int, repeats: int, rng: np.random.Generator,
                threads: int = 1) -> dict:
    """softknn.generate.kernel builds (what the server runs between the graph's segments) over B rows of
    `columns` past columns and T new tokens each, 30 layers of their own int8 caches (read from memory, as a
    step reads them), the builds alternating on the same inputs within each repeat (their order turned each
    time): per build, median ms; and, on the last layer's first row, its largest difference from the float64
    reference (kernel.attend_reference)."""
    from softknn.generate import kernel

    S = columns + T
    C = 128 * -(-S // 128)
    q = (rng.standard_normal((B, T, HEADS * DIM)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((B, T, KV_HEADS * DIM)) * 0.25).astype(np.float32)
    v = (rng.standard_normal((B, T, KV_HEADS * DIM)) * 0.25).astype(np.float32)
    Ks = [np.clip(np.rint(rng.standard_normal((B, KV_HEADS, C, DIM)) * 32), -127, 127).astype(np.int8) for _ in range(LAYERS)]
    Vs = [np.clip(np.rint(rng.standard_normal((B, KV_HEADS, C, DIM)) * 32), -127, 127).astype(np.int8) for _ in range(LAYERS)]
    scale = np.full(KV_HEADS * DIM, 1 / 128, np.float32)
    seqlens = np.full(B, S - 1, np.int32)
    bias = np.zeros((B, T, S), np.float32)
    out, attn = np.empty((B, T, HEADS * DIM), np.float32), np.zeros((B, S), np.float32)
    ref_in = (Ks[-1][:1].copy(), Vs[-1][:1].copy())
    ref, _ = kernel.attend_reference(q[:1], k[:1], v[:1], *ref_in, scale, scale, seqlens[:1], bias[:1])

    def call(kern) -> None:  # every build writes the same new columns: the inputs stay the same
        for li in range(LAYERS):
            kern.attend(q, k, v, Ks[li], Vs[li], scale, scale, seqlens, bias, out, attn, 1.0 / (HEADS * LAYERS),
                        threads=threads)

    names = list(kerns)
    times: dict[str, list[float]] = {n: [] for n in names}
    err: dict[str, float] = {}
    for n in names:
        call(kerns[n])
        err[n] = float(np.abs(ref - out[:1]).max())
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            call(kerns[n])
            times[n].append(time.perf_counter() - t0)
    res = {}
    for n in names:
        ms = 1000 * statistics.median(times[n])
        res[n] = {"ms": round(ms, 2), "ms_per_row": round(ms / B, 3), "ms_per_token": round(ms / (B * T), 3),
                  "max_abs_err_out": err[n]}
    return res


def _against(rev: str) -> Path:
    """attend.c as it was at git revision `rev`, in a temporary file."""
    src = subprocess.run(["git", "show", f"{rev}:softknn/generate/attend.c"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    path = Path(tempfile.mkdtemp(prefix="softknn-against-")) / "attend.c"
    path.write_text(src)
    return path


def run(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(0)
    rows = [int(x) for x in args.rows.split(",")]
    prefill = [int(x) for x in args.prefill.split(",")]
    out: dict = {"command": args.command, "columns": args.columns, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
                 "head_dim": DIM, "threads": 1, "by_cache": {}}
    if not args.kernels_only:  # ONNX Runtime's ops and the MatMulInteger bound
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
        out["matmul_integer_decode"] = {}
        for B in rows:
            ms = _matmul_integer_ms(B, args.columns, args.repeats, rng)
            out["matmul_integer_decode"][str(B)] = {"ms": round(ms, 2), "ms_per_row": round(ms / B, 3)}
            print("MatMulInteger memory attention", B, out["matmul_integer_decode"][str(B)], flush=True)
    from softknn.generate import kernel
    from softknn.generate.runtime import cores

    threads = args.threads or cores()
    against = _against(args.against) if args.against else None
    if against is not None:
        out["against"] = {"revision": args.against, "commit": subprocess.run(
            ["git", "rev-parse", args.against], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent
        ).stdout.strip()}
    builds = [("kernel", False, 1, None), ("kernel_threads", False, threads, None), ("kernel_generic", True, 1, None)]
    if against is not None:  # timed alternating with the build of the same name (their first two)
        builds = [("kernel", False, 1, against), ("kernel_threads", False, threads, against),
                  ("kernel_generic", True, 1, None)]
    for build, generic, n, other in builds:
        kern, how = kernel.load(Path(tempfile.mkdtemp(prefix="softknn-kernel-")), generic=generic)
        kerns = {build: kern}
        res = {"built": how, "threads": n} if kern is not None else {"skipped": how}
        res_other: dict = {}
        if other is not None and kern is not None:
            kern_other, how_other = kernel.load(Path(tempfile.mkdtemp(prefix="softknn-kernel-")), source=other)
            res_other = {"built": how_other, "threads": n, "revision": args.against}
            if kern_other is not None:
                kerns[f"{build}_against"] = kern_other
        if kern is not None:
            for label, B, T in [(f"decode_{B}", B, 1) for B in rows] + [(f"prefill_{T}", 1, T) for T in prefill]:
                got = _kernels_ms(kerns, B, T, args.columns, args.repeats, rng, n)
                res[label] = got[build]
                if f"{build}_against" in got:
                    res_other[label] = got[f"{build}_against"]
                print(build, label, {x: v["ms"] for x, v in got.items()}, flush=True)
        out[build] = res
        if res_other:
            out[f"{build}_against"] = res_other
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    payload = write(args.name, out)
    plot(payload, args.name)
    return payload


def plot(payload: dict, name: str = "attention_kernel") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for kv, res in payload["by_cache"].items():
        d, p = res["decode"], res["prefill"]
        a.plot([int(x) for x in d], [v["ms"] for v in d.values()], "o-", label=f"{kv} cache")
        b.plot([int(x) for x in p], [v["ms"] for v in p.values()], "o-", label=f"{kv} cache")
    mi = payload.get("matmul_integer_decode") or {}
    if mi:
        a.plot([int(x) for x in mi], [v["ms"] for v in mi.values()], "s--", label="int8, MatMulInteger (memory only)")
    for build, style in (("kernel", "^-"), ("kernel_threads", "D-"), ("kernel_generic", "v--"),
                         ("kernel_against", "^:"), ("kernel_threads_against", "D:")):
        res = payload.get(build) or {}
        dec = {int(x.split("_")[1]): v["ms"] for x, v in res.items() if x.startswith("decode_")}
        pre = {int(x.split("_")[1]): v["ms"] for x, v in res.items() if x.startswith("prefill_")}
        label = "int8, softknn's C kernel" + (" (plain loops)" if build.endswith("generic") else
                                              f" ({res.get('threads')} threads)" if "threads" in build else "")
        if build.endswith("against"):
            label += f" at {res.get('revision')}"
        if dec:
            a.plot(list(dec), list(dec.values()), style, label=label)
        if pre:
            b.plot(list(pre), list(pre.values()), style, label=label)
    a.set(xlabel="rows (decode step, T = 1)", ylabel="ms per call, 30 layers", title="decode")
    b.set(xlabel="prompt tokens (prefill, B = 1)", ylabel="ms per call, 30 layers", title="prefill")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{payload['columns']} past columns a row, one thread (but the kernel's threads)")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    main(["attention_kernel", *sys.argv[1:]])
