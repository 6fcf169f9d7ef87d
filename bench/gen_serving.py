"""Generation serving beside llama.cpp: time to first token, decode tokens/s and concurrent streams.

One run, one thread each (`torch.set_num_threads(1)`, the decode graph's ONNX Runtime with 1 thread,
llama.cpp `n_threads` 1), the sample KB built with the generator (fp16 store, all 30 layers), every
answer MAX_TOKENS tokens long (`ignore_eos`, as llama.cpp's and vLLM's benchmarks run), greedy:

- `single`: for k in KS and the first QUESTIONS test questions of the sample QA set, interleaved per
  question: softknn memory (the decode graph, each weight format asked), softknn memory in torch with the
  memory hook (the reference path), softknn prompt mode (R's text in the prompt, the graph), the first
  weight format with the KV cache in `--kv-baseline` format (when given) beside the default (int8), and
  llama.cpp prompt-RAG on the very token ids of softknn's prompt mode. TTFT = the call to the first
  token (softknn: retrieval, placing R, prefill; llama.cpp: prefill of the tokenised prompt); decode
  tok/s over the remaining tokens; prefill tok/s = prompt tokens / TTFT for the prompt modes. Medians.
- `streams`: N = 1, 4, 8, 16 concurrent streams through `POST /v1/chat/completions` (stream: true) of
  a live `softknn serve` (the default weights, KV cache and attention, one decode-graph thread for a
  one-row step, a batched step's rows cut into lanes on the cores (generator.lanes), the kernel on the
  cores; and the
  same server with the `--attention-baseline` attention, graph (ONNX Runtime's GroupQueryAttention in
  place of the C kernel), the `--weights-baseline` weights, q4a8, and the `--kv-baseline` KV cache where
  given, side by side), each a different question,
  k = 8, all sent at once; aggregate tokens/s (all tokens / wall time from the first request to the
  last token), per-stream p50 inter-token latency, TTFT, and the server's peak RSS (anonymous and
  file-backed: the mapped generator store is the latter); and llama.cpp the way llama-server serves
  (bench/llama_cpp_worker.py `serve`: N slots, each request's prompt prefilled in chunks inside the
  same batches that decode the running ones), on the prompt-RAG prompts of the same questions, with
  `--llama-stream-threads` threads (0, the default: the cores, as the server's batched steps use them),
  in its own process.
- `obliqa`: 1 and 16 streams of ObliQA questions against the ObliQA bundle `gen_build` builds (1,000
  regulatory passages, q4 store), k = 8: the server's peak RSS beside its mapped store's size.
- `profile` (not in the default parts): py-spy on the `streams` server while the largest level runs,
  and the decode thread's time split into decode steps, prefills, placing memory, choosing tokens
  (`decode_thread_split`); every thread's inclusive shares in bench/results/NAME_profile.txt.

    python -m bench gen_serving [--questions 4] [--ks 4,8,16] [--streams 1,4,8,16] [--weights w8a8,q4a8]
        [--attention-baseline graph] [--weights-baseline q4a8] [--kv-baseline fp32]
        [--max-tokens 128] [--llama-python /work/peers/llamacpp/venv/bin/python
        --llama-preload /work/peers/llamacpp/libisoc23shim.so]

→ bench/results/gen_serving.json and .png, with this process's and the server's peak RSS. llama.cpp's
venv: ../shared/PEERS.md (its parts are skipped, saying so, when its python is absent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.common import RESULTS, speed_probe, write

ROOT = Path(__file__).resolve().parents[1]
LLAMA_PY = Path("/work/peers/llamacpp/venv/bin/python")
LLAMA_PRELOAD = Path("/work/peers/llamacpp/libisoc23shim.so")


class LlamaCpp:
    """bench/llama_cpp_worker.py in llama.cpp's venv: one JSON line in, one out."""

    def __init__(self, python: Path, preload: Path, gguf: Path, n_ctx: int, n_seq: int, threads: int = 1):
        env = {**os.environ, "LD_PRELOAD": str(preload)}
        self.proc = subprocess.Popen([str(python), str(ROOT / "bench" / "llama_cpp_worker.py"), str(gguf), str(n_ctx),
                                      str(n_seq), str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     text=True)

    def ask(self, req: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        rep = json.loads(self.proc.stdout.readline())
        if "error" in rep:
            raise RuntimeError(f"llama.cpp worker: {rep['error']}")
        return rep

    def close(self) -> None:
        try:
            self.ask_quit()
        finally:
            self.proc.wait(30)

    def ask_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.flush()


def _decode_rate(times: list[float]) -> float | None:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


def _stream_softknn(ge, params, question: str) -> dict:
    from bench.generation import msgs
    from softknn.generate.model import Step

    t0 = time.perf_counter()
    times = []
    ans = None
    for item in ge.stream(params, messages=msgs(question)):
        if isinstance(item, Step):
            times.append(time.perf_counter() - t0)
        else:
            ans = item
    end = time.perf_counter() - t0
    ttft = times[0] if times else end
    return {"ttft_s": ttft, "decode_tok_s": _decode_rate(times), "tokens": len(times),
            "prompt_tokens": ans.usage["prompt_tokens"], "memory_tokens": ans.diagnostics["memory_tokens"],
            "prefill_tok_s": ans.usage["prompt_tokens"] / ttft, "runtime": ans.diagnostics["runtime"]}


def _median(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(xs), 4) if xs else None


def single(args, ctx) -> dict:
    from bench.generation import msgs
    from softknn.generate.engine import GenEngine, GenParams
    from softknn.retrieval.search import Retriever

    enc, gen, bundle, qs, llama = ctx["enc"], ctx["gen"], ctx["bundle"], ctx["questions"], ctx["llama"]
    ks = [int(x) for x in args.ks.split(",")]
    weights = args.weights.split(",")
    engines = {f"memory_{w}": (GenEngine(Retriever(bundle), enc, gen, weights=w), {}) for w in weights}
    if args.kv_baseline:  # the first format with the other KV cache format, beside the default
        engines[f"memory_{weights[0]}_kv_{args.kv_baseline}"] = (
            GenEngine(Retriever(bundle), enc, gen, weights=weights[0], kv_cache=args.kv_baseline), {})
    engines["memory_torch"] = (GenEngine(Retriever(bundle), enc, gen, runtime="torch"), {})
    engines["prompt_graph"] = (GenEngine(Retriever(bundle), enc, gen, weights=weights[0]), {"context": "prompt"})
    base = GenParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for ge, extra in engines.values():  # warm-up: each decode graph built and run once
        _stream_softknn(ge, replace(base, k=4, max_tokens=4, **extra), qs[0]["question"])
    rows: dict[str, dict[int, list[dict]]] = {name: {k: [] for k in ks} for name in [*engines, "llama_cpp"]}
    for k in ks:
        for i, q in enumerate(qs):
            order = list(engines) + ["llama_cpp"]
            if i % 2:
                order.reverse()  # interleaved, order alternating by question
            for name in order:
                if name == "llama_cpp":
                    if llama is None:
                        continue
                    ge = engines["prompt_graph"][0]
                    prep = ge.prepare(replace(base, k=k, context="prompt"), None, msgs(q["question"]))
                    ids = prep.prefix + prep.rest
                    r = llama.ask({"op": "serve", "prompts": [ids], "arrivals": [0.0], "max_tokens": args.max_tokens,
                                   "ignore_eos": True})["streams"][0]
                    ttft = r["times"][0] - r["arrival_s"]
                    rows[name][k].append({"ttft_s": ttft, "decode_tok_s": _decode_rate(r["times"]),
                                          "tokens": len(r["times"]), "prompt_tokens": len(ids),
                                          "prefill_tok_s": len(ids) / ttft, "q": q["id"]})
                    continue
                ge, extra = engines[name]
                rows[name][k].append({**_stream_softknn(ge, replace(base, k=k, **extra), q["question"]), "q": q["id"]})
    summ = {}
    for name, per_k in rows.items():
        summ[name] = {str(k): {"ttft_median_s": _median(r, "ttft_s"), "decode_tok_s_median": _median(r, "decode_tok_s"),
                               "prefill_tok_s_median": _median(r, "prefill_tok_s"),
                               "prompt_tokens_median": _median(r, "prompt_tokens"),
                               "memory_tokens_median": _median(r, "memory_tokens")} for k, r in per_k.items() if r}
    for ge, _ in engines.values():  # the decode loops (one per weight format) and their caches go with them
        ge.generator.close_loops()
    return {"summary": summ, "runs": {n: {str(k): r for k, r in v.items()} for n, v in rows.items()}}


async def _chat_streams(url: str, questions: list[str], k: int, max_tokens: int) -> list[list[float]]:
    """N concurrent streamed chat completions; each stream's token arrival times after the common start."""
    import httpx

    t0 = time.perf_counter()

    async def one(client, q: str) -> list[float]:
        times = []
        body = {"messages": [{"role": "user", "content": q}], "stream": True, "max_tokens": max_tokens, "k": k,
                "temperature": 0, "ignore_eos": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = json.loads(line[6:])
                    if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content") is not None:
                        times.append(time.perf_counter() - t0)
        return times

    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        return list(await asyncio.gather(*(one(client, q) for q in questions)))


def _streams_summary(streams: list[list[float]], arrivals: list[float] | None = None) -> dict:
    """Aggregate tokens/s over the wall time from the first arrival to the last token; per stream the
    median gap between its tokens; TTFT from each stream's arrival."""
    arrivals = arrivals or [0.0] * len(streams)
    tokens = sum(len(s) for s in streams)
    wall = max(s[-1] for s in streams if s) - min(arrivals)
    gaps = [b - a for s in streams for a, b in zip(s, s[1:])]
    per_stream_p50 = [statistics.median([b - a for a, b in zip(s, s[1:])]) for s in streams if len(s) > 2]
    ttft = [s[0] - a for s, a in zip(streams, arrivals) if s]
    return {"streams": len(streams), "tokens": tokens, "wall_s": round(wall, 3), "aggregate_tok_s": round(tokens / wall, 2),
            "inter_token_p50_ms": round(1000 * statistics.median(gaps), 2) if gaps else None,
            "per_stream_p50_ms_median": round(1000 * statistics.median(per_stream_p50), 2) if per_stream_p50 else None,
            "ttft_median_s": round(statistics.median(ttft), 3), "ttft_max_s": round(max(ttft), 3)}


class RssWatch:
    """Polls a process's anonymous and file-backed resident memory (/proc/PID/status) every `every` s;
    the peaks, in MB. The kernel's own VmHWM is the peak of their sum."""

    def __init__(self, pid: int, every: float = 0.2):
        import threading

        self.pid, self.every = pid, every
        self.peak = {"rss_anon_mb": 0.0, "rss_file_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, float]:
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, val = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = int(val.split()[0]) / 1024
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = self._read()
            except OSError:
                return
            self.peak["rss_anon_mb"] = max(self.peak["rss_anon_mb"], r.get("RssAnon", 0.0))
            self.peak["rss_file_mb"] = max(self.peak["rss_file_mb"], r.get("RssFile", 0.0))
            self.peak["vm_hwm_mb"] = r.get("VmHWM", 0.0)
            self._stop.wait(self.every)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(2)
        return {k: round(v, 1) for k, v in self.peak.items()}


def _softknn_streams(ctx, env: dict, levels: list[int], qs: list[str], max_tokens: int, label: str = "softknn"
                     ) -> tuple[dict, dict, dict]:
    """A live `softknn serve` of the sample bundle with `env`: per level the streams' summary, the
    server's peak RSS, and its diagnostics.runtime."""
    from tests.harness import LiveServer, free_port

    port = free_port()
    srv = LiveServer.spawn(LiveServer.command(ctx["bundle_path"], port, log_level="warning"),
                           Path("/tmp/bench_gen_serving.log"), port=port, env=env)
    per: dict = {}
    try:
        srv.wait_ready(600)
        watch = RssWatch(srv.proc.pid)
        asyncio.run(_chat_streams(srv.url, qs[:2], 8, 4))  # warm-up: the decode graph is built on first use
        for n in levels:
            per[str(n)] = _streams_summary(asyncio.run(_chat_streams(srv.url, qs[:n], 8, max_tokens)))
            print(label, n, per[str(n)], flush=True)
        rss = watch.stop()
        probe = srv.client.post("/v1/generate", json={"prompt": qs[0], "max_tokens": 1, "k": 8}).json()
        runtime = probe["diagnostics"]["runtime"]
    finally:
        srv.close()
    return per, rss, runtime


def streams(args, ctx) -> dict:
    from bench.generation import gen_engine, msgs
    from softknn.generate.engine import GenParams
    from softknn.generate.runtime import cores

    levels = [int(x) for x in args.streams.split(",")]
    qs = [q["question"] for q in ctx["all_test"]]
    env = {"HF_HUB_OFFLINE": "1", "SOFTKNN_GENERATOR__THREADS": "1", "SOFTKNN_GENERATOR__MAX_CONCURRENT": str(max(levels)),
           "SOFTKNN_MODEL__THREADS": "1"}
    if args.server_weights:
        env["SOFTKNN_GENERATOR__WEIGHTS"] = args.server_weights
    out: dict = {"softknn": {}, "llama_cpp": {}, "k": 8, "max_tokens": args.max_tokens,
                 "llama_cpp_threads": args.llama_stream_threads or cores()}
    out["softknn"], out["server_peak_rss"], out["server_runtime"] = _softknn_streams(ctx, env, levels, qs, args.max_tokens)
    if args.kv_baseline:  # the same server with another KV cache format, side by side
        name = f"softknn_kv_{args.kv_baseline}"
        out[name], out[f"server_peak_rss_kv_{args.kv_baseline}"], _ = _softknn_streams(
            ctx, {**env, "SOFTKNN_GENERATOR__KV_CACHE": args.kv_baseline}, levels, qs, args.max_tokens, name)
    if args.attention_baseline:  # the same server with the other attention, side by side
        name = f"softknn_attn_{args.attention_baseline}"
        out[name], out[f"server_peak_rss_attn_{args.attention_baseline}"], out[f"server_runtime_attn_{args.attention_baseline}"] = \
            _softknn_streams(ctx, {**env, "SOFTKNN_GENERATOR__ATTENTION": args.attention_baseline}, levels, qs,
                             args.max_tokens, name)
    if args.weights_baseline:  # the same server with another weight format, side by side
        name = f"softknn_w_{args.weights_baseline}"
        out[name], out[f"server_peak_rss_w_{args.weights_baseline}"], _ = _softknn_streams(
            ctx, {**env, "SOFTKNN_GENERATOR__WEIGHTS": args.weights_baseline}, levels, qs, args.max_tokens, name)
    if ctx["have_llama"]:
        ge = gen_engine(ctx["enc"], ctx["gen"], ctx["bundle"])
        prompts = [(lambda p: p.prefix + p.rest)(ge.prepare(GenParams(k=8, context="prompt"), None, msgs(q)))
                   for q in qs[: max(levels)]]
        per_seq = max(len(p) for p in prompts) + args.max_tokens + 8
        for n in levels:
            llama = LlamaCpp(Path(args.llama_python), Path(args.llama_preload), ctx["gguf"], per_seq * n, n,
                             threads=out["llama_cpp_threads"])
            try:
                llama.ask({"op": "serve", "prompts": prompts[:1], "arrivals": [0.0], "max_tokens": 2})  # warm-up
                r = llama.ask({"op": "serve", "prompts": prompts[:n], "arrivals": [0.0] * n,
                               "max_tokens": args.max_tokens, "ignore_eos": True})
                out["llama_cpp"][str(n)] = _streams_summary([s["times"] for s in r["streams"]],
                                                            [s["arrival_s"] for s in r["streams"]])
                print("llama.cpp", n, out["llama_cpp"][str(n)], flush=True)
            finally:
                llama.close()
    return out


def streams_obliqa(args, ctx) -> dict:
    """16 streams (and 1) of ObliQA questions against the ObliQA bundle gen_build builds (q4 store,
    calibrated), k 8, MAX_TOKENS each: the server's peak RSS beside the size of its mapped store."""
    from bench.gen_quality import QA_OBLIQA
    from bench.generation import CACHE
    from tests.harness import LiveServer, free_port

    path = CACHE / "gen-build-obliqa"
    if not (path / "manifest.json").exists():
        return {"skipped": f"{path} absent: python -m bench gen_build --kb obliqa builds it"}
    qs = [json.loads(x)["question"] for x in QA_OBLIQA.read_text().splitlines() if x.strip()]
    store_mb = sum(f.stat().st_size for f in (path / "generator").glob("*")) / 2**20
    port = free_port()
    env = {"HF_HUB_OFFLINE": "1", "SOFTKNN_GENERATOR__THREADS": "1", "SOFTKNN_GENERATOR__MAX_CONCURRENT": "16",
           "SOFTKNN_MODEL__THREADS": "1"}
    srv = LiveServer.spawn(LiveServer.command(path, port, log_level="warning"), Path("/tmp/bench_gen_serving_obliqa.log"),
                           port=port, env=env)
    out: dict = {"bundle": str(path), "generator_store_mb": round(store_mb, 1), "k": 8, "softknn": {}}
    try:
        srv.wait_ready(900)
        watch = RssWatch(srv.proc.pid)
        for n in (1, 16):
            out["softknn"][str(n)] = _streams_summary(asyncio.run(_chat_streams(srv.url, qs[:n], 8, args.max_tokens)))
            print("softknn obliqa", n, out["softknn"][str(n)], flush=True)
        out["server_peak_rss"] = watch.stop()
    finally:
        srv.close()
    return out


# the decode thread's time, by what it runs (py-spy frames, first match wins)
DECODE_PARTS = (("step: ORT", ("DecodeLoop._step", "Bound.run")),  # the decode graph's run
                ("prefill: ORT", ("DecodeLoop._prefill_chunk", "DecoderSession.run")),
                ("place memory", ("KVCache.place",)),  # a new request's row
                ("tokens+trace", ("DecodeLoop._emit",)),  # choosing the token, its text, the evidence trace
                ("step: Python", ("DecodeLoop._step",)),  # masks, binding
                ("prefill: Python", ("DecodeLoop._prefill_chunk",)))


def decode_thread_split(raw: Path) -> dict:
    """Samples of py-spy's raw (collapsed) stacks per thread kind, and the decode thread's split into
    DECODE_PARTS (the rest: 'other'), as shares of its samples."""
    from bench.profile_service import stacks

    totals: dict[str, int] = {}
    parts: dict[str, int] = {}
    for thread, names, n in stacks(raw):
        kind = ("decode loop" if "softknn-decode" in thread else "request threads" if "softknn-gen" in thread
                else "event loop" if "MainThread" in thread else "other threads")
        totals[kind] = totals.get(kind, 0) + n
        if kind != "decode loop":
            continue
        part = next((label for label, need in DECODE_PARTS if all(x in names for x in need)), "other")
        parts[part] = parts.get(part, 0) + n
    busy = totals.get("decode loop", 0)
    return {"samples_by_thread": totals,
            "decode_thread_share": {k: round(v / busy, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])} if busy else {}}


def profile(args, ctx) -> dict:
    """py-spy on the `streams` server while the last --streams level runs (the figures of that run are
    py-spy's, slowed by its sampling: the split is the point); the decode thread's split and every
    thread's inclusive shares (bench/profile_service.summarize) in bench/results/NAME_profile.txt."""
    import shutil

    from bench.profile_service import summarize
    from tests.harness import LiveServer, free_port

    n = max(int(x) for x in args.streams.split(","))
    qs = [q["question"] for q in ctx["all_test"]]
    env = {"HF_HUB_OFFLINE": "1", "SOFTKNN_GENERATOR__THREADS": "1", "SOFTKNN_GENERATOR__MAX_CONCURRENT": str(n),
           "SOFTKNN_MODEL__THREADS": "1"}
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    port = free_port()
    srv = LiveServer.spawn(LiveServer.command(ctx["bundle_path"], port, log_level="warning"),
                           Path("/tmp/bench_gen_serving_profile.log"), port=port, env=env)
    raw = Path("/tmp") / f"{args.name}_profile.raw"
    try:
        srv.wait_ready(600)
        asyncio.run(_chat_streams(srv.url, qs[:2], 8, 4))  # warm-up: the decode graph
        spy = subprocess.Popen([pyspy, "record", "--pid", str(srv.proc.pid), "--format", "raw", "--output", str(raw),
                                "--rate", "100", "--threads", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1)
        run = _streams_summary(asyncio.run(_chat_streams(srv.url, qs[:n], 8, args.max_tokens)))
        spy.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
        spy.wait(60)
    finally:
        srv.close()
    out = {"streams": n, "k": 8, "max_tokens": args.max_tokens, "run_under_pyspy": run, **decode_thread_split(raw),
           "file": str(RESULTS / f"{args.name}_profile.txt")}
    (RESULTS / f"{args.name}_profile.txt").write_text(f"{args.command}\n{n} streams under py-spy: {run}\n" + summarize(raw))
    print(json.dumps(out, indent=1), flush=True)
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--questions", type=int, default=4, help="test questions per k in `single`")
    ap.add_argument("--ks", default="4,8,16")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--weights", default="w8a8,q4a8", help="decode-graph weight formats of `single` (the first also "
                    "runs its prompt mode)")
    ap.add_argument("--server-weights", default="", help="SOFTKNN_GENERATOR__WEIGHTS of the `streams` server "
                    "(default: the settings' default)")
    ap.add_argument("--kv-baseline", default="", help="`streams` also runs the server with this KV cache format "
                    "(SOFTKNN_GENERATOR__KV_CACHE), side by side; empty: not")
    ap.add_argument("--attention-baseline", default="graph", help="`streams` also runs the server with this decode "
                    "attention (SOFTKNN_GENERATOR__ATTENTION: graph = ONNX Runtime's GroupQueryAttention, beside the "
                    "default C kernel), side by side; empty: not")
    ap.add_argument("--weights-baseline", default="q4a8", help="`streams` also runs the server with this weight format "
                    "(SOFTKNN_GENERATOR__WEIGHTS), side by side; empty: not")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens every answer decodes (ignore_eos)")
    ap.add_argument("--parts", default="single,streams,obliqa", help="also: profile (py-spy on the server at the "
                    "largest --streams level, a run of its own: python -m bench gen_serving --parts profile --name gen_serving_profile)")
    ap.add_argument("--name", default="gen_serving", help="result file name (bench/results/NAME.json): a partial "
                    "run under another name leaves the full run's file alone")
    ap.add_argument("--llama-python", default=str(LLAMA_PY))
    ap.add_argument("--llama-preload", default=str(LLAMA_PRELOAD))
    ap.add_argument("--llama-stream-threads", type=int, default=0,
                    help="llama.cpp's threads in the streams part (0 = cores; `single` keeps 1)")


def _peak_rss_mb() -> dict[str, float]:
    import resource

    return {"self_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "children_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}


def run(args: argparse.Namespace) -> dict:
    from bench.generation import CACHE, get_bundle, load_qa, models, setup_threads
    from softknn.generate.model import resolve_generator

    setup_threads()
    t_start = time.perf_counter()
    enc, gen = models()
    bundle, binfo = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    folder, gguf = resolve_generator("smollm2-135m-instruct")
    test = [q for q in load_qa() if q["split"] == "test"]
    have_llama = bool(args.llama_python) and Path(args.llama_python).exists()
    ctx = {"enc": enc, "gen": gen, "bundle": bundle, "bundle_path": Path(binfo["path"]), "questions": test[: args.questions],
           "all_test": test, "gguf": folder / gguf, "llama": None, "have_llama": have_llama}
    parts = args.parts.split(",")
    payload: dict = {"command": getattr(args, "command", "python -m bench gen_serving"), "bundle": binfo,
                     "max_tokens": args.max_tokens, "threads": 1,
                     "llama_cpp": "llama-cpp-py-sync 0.11739 (llama.cpp b11739), bench/llama_cpp_worker.py"
                     if have_llama else f"not run: {args.llama_python} absent (../shared/PEERS.md)"}
    # the machine's speed as each part starts (bench.common.speed_probe): a slow stretch shows here
    payload["speed_probe"] = {"start": speed_probe()}
    if "single" in parts:
        if have_llama:
            ctx["llama"] = LlamaCpp(Path(args.llama_python), Path(args.llama_preload), folder / gguf, 8192, 1)
        try:
            payload["single"] = single(args, ctx)
        finally:
            if ctx["llama"] is not None:
                ctx["llama"].close()
        print(json.dumps(payload["single"]["summary"], indent=1), flush=True)
    if "streams" in parts:
        payload["speed_probe"]["streams"] = speed_probe()
        payload["streams"] = streams(args, ctx)
    if "obliqa" in parts:
        payload["speed_probe"]["obliqa"] = speed_probe()
        payload["streams_obliqa"] = streams_obliqa(args, ctx)
    if "profile" in parts:
        payload["profile"] = profile(args, ctx)
    payload["speed_probe"]["end"] = speed_probe()
    payload["wall_s"] = round(time.perf_counter() - t_start, 1)
    payload["peak_rss"] = _peak_rss_mb()
    out = write(getattr(args, "name", "gen_serving"), payload)
    plot(payload, getattr(args, "name", "gen_serving"))
    return out


def plot(payload: dict, name: str = "gen_serving") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "single" not in payload and "streams" not in payload and "profile" in payload:  # a profile run alone
        from bench.common import plot_bars

        share = payload["profile"]["decode_thread_share"]
        plot_bars(name, list(share), [100 * v for v in share.values()], None,
                  "% of the decode thread's samples", f"decode thread at {payload['profile']['streams']} streams (py-spy)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    if "single" in payload:
        summ = payload["single"]["summary"]
        for label, per_k in summ.items():
            ks = sorted(int(k) for k in per_k)
            axes[0].plot(ks, [per_k[str(k)]["ttft_median_s"] * 1000 for k in ks], marker="o", label=label)
            axes[1].plot(ks, [per_k[str(k)]["decode_tok_s_median"] or 0 for k in ks], marker="o", label=label)
        axes[0].set(xlabel="k", ylabel="TTFT median (ms)", title="time to first token", yscale="log")
        axes[1].set(xlabel="k", ylabel="tokens/s (median, 1 thread)", title="decode speed")
        axes[0].legend(fontsize=7)
        axes[1].legend(fontsize=7)
    if "streams" in payload:
        for label in ("softknn", *[n for n in payload["streams"] if n.startswith(("softknn_kv_", "softknn_w_", "softknn_attn_"))], "llama_cpp"):
            per_n = payload["streams"].get(label) or {}
            ns = sorted(int(n) for n in per_n)
            if ns:
                axes[2].plot(ns, [per_n[str(n)]["aggregate_tok_s"] for n in ns], marker="o", label=label)
        axes[2].set(xlabel="concurrent streams", ylabel="aggregate tokens/s",
                    title=f"streams (k = 8, {payload['max_tokens']} tokens each, 1 thread)")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["gen_serving", *sys.argv[1:]])
