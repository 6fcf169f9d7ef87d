"""Generation quality: the compact generator memories against fp16, and the per-KB calibrated defaults
against prompt-stuffed RAG on ObliQA.

- `memory`: the sample KB built with each generator memory (fp16, int8, q4, q2, and q4 / q2 keeping half
  of each chunk's tokens), all 30 layers; bytes per token (the manifest's measured figure) and answer
  accuracy on the sample QA test split (95 questions), each at the same fixed parameters (joint, k = 4,
  β = 4, greedy, 32 tokens), so only the memory differs; answers agreeing with fp16's.
- `obliqa`: a KB of ObliQA passages (the gold passages of bench/data/obliqa_qa.jsonl's 150 hand-written
  short-answer and fill-in-the-blank questions plus distractors from their documents, ~1,000 passages),
  built with the generator and its calibration (softknn.generate.calibration chooses k and β from the
  KB's own pseudo-questions). On the validation (50) and test (100) splits, greedy, 24 tokens, the same
  retrieval for every mode: no KB; prompt-stuffed RAG at the calibrated k and at k = 4; softknn's
  calibrated default (no k, no prior in the request); softknn at the old fixed default (k = 4, β = 4) and
  at β = 0; positions reordered; and the gold passage alone in memory vs in the prompt.

    python -m bench gen_quality memory [--variants fp16,int8,q4,q2,q4@0.5,q2@0.5] [--limit 0]
    python -m bench gen_quality obliqa [--passages 1000] [--memory fp16] [--limit 0]
    python -m bench gen_quality sample [--memory fp16] [--limit 0]
    python -m bench gen_quality weights [--formats q4,q4a8,fp32] [--limit 0]
    python -m bench gen_quality multichunk [--kbs sample,obliqa] [--max-tokens 24] [--limit 0] [--split test]
    python -m bench gen_quality kv [--kbs sample,obliqa] [--max-tokens 24] [--limit 0]

- `multichunk`: memory against prompt-stuffed RAG at k 4 and 8, and the calibrated default against the
  prompt at its k, on the sample KB and the ObliQA KB as gen_build builds them (q4 store, calibrated),
  test splits, greedy, 24 tokens, refusal off, with the time to first token of each answer.
- `kv`: the decode graph's KV cache formats (int8, fp32) on the same bundles as `multichunk`, test splits,
  at the calibrated default and k 4 and 8: accuracy, answers equal to fp32's, items right in one only.
- `weights`: the decode graph's weight formats on the sample KB's calibrated build and test split, at the
  calibrated default, k 4 β 4 and k 8 β 0: accuracy and answers equal to q4's (the GGUF file's own
  numbers), with the torch reference beside them.
- `sample`: the same comparison on the sample KB (built with the generator and its calibration) over the
  sample QA validation and test splits: calibrated default vs prompt-stuffed RAG at the calibrated k and
  at k = 4, and the old fixed default (k = 4, β = 4).

→ bench/results/gen_quality_<part>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.common import RESULTS, write

ROOT = Path(__file__).resolve().parents[1]
QA_OBLIQA = ROOT / "bench" / "data" / "obliqa_qa.jsonl"


def _correct(text: str, q: dict) -> bool:
    from softknn.generate.calibration import answer_contains

    return any(answer_contains(text, r) for r in [q["answer"], *q.get("aliases", [])])


def _summary(rows: list[dict]) -> dict:
    n = len(rows)
    acc = sum(r["correct"] for r in rows) / n if n else 0.0
    return {"n": n, "correct": sum(r["correct"] for r in rows), "accuracy": round(acc, 4),
            "se": round((acc * (1 - acc) / n) ** 0.5, 4) if n else None}


def _ask(ge, params, q: dict, **kw) -> dict:
    from bench.generation import msgs

    t0 = time.perf_counter()
    a = ge.answer(params, messages=msgs(q["question"]), **kw)
    return {"id": q["id"], "answer": a.text.strip(), "correct": _correct(a.text, q), "k": a.diagnostics["k"],
            "prior": a.diagnostics.get("prior"), "R": [e.chunk_id for e in sorted(a.evidence, key=lambda e: -e.weight)],
            "s": round(time.perf_counter() - t0, 2)}


# --- memory ---------------------------------------------------------------------------------------------
def memory(args) -> dict:
    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models
    from softknn.generate.engine import GenParams

    enc, gen = models()
    kb = ROOT / "softknn" / "sample_kb" / "kb"
    test = [q for q in load_qa() if q["split"] == "test"][: args.limit or None]
    base = GenParams(max_tokens=32, temperature=0.0, k=4, prior=4.0, mixing="joint")
    out: dict = {}
    answers: dict[str, list[str]] = {}
    for v in args.variants.split(","):
        kind, _, keep = v.partition("@")
        t0 = time.perf_counter()
        b, info = get_bundle(kb, CACHE / f"gen-mem-{kind}-{keep or '1'}", enc, gen, memory=kind,
                             generator_keep=float(keep or 1.0), generator_calibrate=False)
        ge = gen_engine(enc, gen, b)
        rows = [_ask(ge, base, q) for q in test]
        answers[v] = [r["answer"] for r in rows]
        rec = b.manifest.generator
        out[v] = {"memory": kind, "keep": float(keep or 1.0), "bytes_per_token": rec.bytes_per_token,
                  "bytes_per_token_formula": rec.bytes_per_token_formula, "bytes_per_chunk": rec.bytes_per_chunk,
                  "bundle": info, "test": _summary(rows), "wall_s": round(time.perf_counter() - t0, 1),
                  "per_question": rows}
        print(v, {k: x for k, x in out[v].items() if k != "per_question"}, flush=True)
    # variants not rerun keep their last measured rows (the file names when each was measured)
    prev = ROOT / "bench" / "results" / "gen_quality_memory.json"
    if prev.is_file():
        for v, rec in json.loads(prev.read_text()).get("variants", {}).items():
            if v not in out and rec.get("per_question"):
                out[v] = {**rec, "measured": rec.get("measured") or "an earlier run (see git log)"}
                answers[v] = [r["answer"] for r in rec["per_question"]]
    when = time.strftime("%Y-%m-%d")
    for v in args.variants.split(","):
        out[v]["measured"] = when
    ref = answers.get("fp16")
    if ref:
        for v in out:
            out[v]["same_answer_as_fp16"] = round(sum(a == b for a, b in zip(answers[v], ref)) / len(ref), 4)
            out[v]["accuracy_minus_fp16"] = round(out[v]["test"]["accuracy"] - out["fp16"]["test"]["accuracy"], 4)
    payload = {"command": getattr(args, "command", ""), "params": "joint, k 4, β 4, greedy, 32 tokens, composite",
               "questions": len(test), "variants": out}
    res = write("gen_quality_memory", payload)
    _plot_memory(out)
    return res


def _plot_memory(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v, r in out.items():
        ax.scatter(r["bytes_per_token"], r["test"]["accuracy"], s=40)
        ax.annotate(v, (r["bytes_per_token"], r["test"]["accuracy"]), fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.axvline(2048, ls="--", c="grey", lw=0.8)
    ax.set(xscale="log", xlabel="stored bytes per token (log)", ylabel="sample QA test accuracy (n = 95)",
           title="generator memory: bytes vs answers")
    fig.tight_layout()
    fig.savefig(RESULTS / "gen_quality_memory.png", dpi=110)
    plt.close(fig)


# --- obliqa ---------------------------------------------------------------------------------------------
def obliqa_qa_kb(qs: list[dict], n_passages: int, seed: int = 0) -> Path:
    """A JSONL KB: every gold passage of the questions, plus distractors from their documents."""
    from bench.generation import CACHE, OBLIQA

    docs: dict = {}
    for f in sorted((OBLIQA / "documents").glob("*.json")):
        for p in json.loads(f.read_text()):
            docs.setdefault(p["DocumentID"], []).append(p)
    gold = {(g["DocumentID"], g["PassageID"]) for q in qs for g in q["gold"]}
    rows = [p for ps in docs.values() for p in ps if (p["DocumentID"], p["PassageID"]) in gold]
    pool = [p for d in sorted({d for d, _ in gold}) for p in docs[d]
            if (p["DocumentID"], p["PassageID"]) not in gold and 40 <= len(p["Passage"]) <= 4000]
    random.Random(seed).shuffle(pool)
    rows += pool[: max(0, n_passages - len(rows))]
    out = CACHE / f"obliqa-qa-{n_passages}" / "kb.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"id": f"{p['DocumentID']}:{p['PassageID']}", "text": p["Passage"]}, ensure_ascii=False)
                   + "\n" for p in rows)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


def obliqa(args) -> dict:
    from bench.generation import CACHE, gen_engine, get_bundle, models
    from softknn.generate.engine import GenParams

    qs = [json.loads(x) for x in QA_OBLIQA.read_text().splitlines() if x.strip()]
    kb = obliqa_qa_kb(qs, args.passages)
    enc, gen = models()
    t0 = time.perf_counter()
    b, info = get_bundle(kb.parent, CACHE / f"obliqa-qa-{args.passages}-gen-{args.memory}", enc, gen, memory=args.memory)
    ge = gen_engine(enc, gen, b)
    cal = (b.manifest.generator.calibration or {}) if b.manifest.generator else {}
    k_cal, beta_cal, src = ge.defaults()
    base = GenParams(max_tokens=24, temperature=0.0)
    modes = {"no_kb": {"use_kb": False},
             "prompt_at_calibrated_k": {"context": "prompt", "k": k_cal},
             "prompt_k4": {"context": "prompt", "k": 4},
             "softknn_calibrated": {},
             "softknn_k4_beta4": {"k": 4, "prior": 4.0},
             "softknn_k4_beta0": {"k": 4, "prior": 0.0},
             "softknn_calibrated_reordered": {"positions": "reordered"}}
    by_id = {c["chunk_id"].split("#")[0]: i for i, c in enumerate(b.chunks)}
    results: dict = {}
    for split in ("validation", "test"):
        sq = [q for q in qs if q["split"] == split][: args.limit or None]
        rows: dict[str, list[dict]] = {m: [] for m in [*modes, "gold_memory", "gold_prompt"]}
        for q in sq:
            for m, kw in modes.items():
                rows[m].append(_ask(ge, replace(base, **kw), q))
            gold_rows = [i for g in q["gold"] for cid, i in by_id.items() if cid == f"{g['DocumentID']}:{g['PassageID']}"]
            for m, ctx in (("gold_memory", "memory"), ("gold_prompt", "prompt")):
                rows[m].append(_gold_only(ge, replace(base, context=ctx), q, gold_rows))
        results[split] = {m: _summary(r) for m, r in rows.items()}
        results[split]["gold_in_R_calibrated"] = round(
            sum(any(cid.split("#")[0] in {f"{g['DocumentID']}:{g['PassageID']}" for g in q["gold"]} for cid in r["R"])
                for q, r in zip(sq, rows["softknn_calibrated"])) / max(len(sq), 1), 4)
        results[split]["per_question"] = rows
        print(split, {m: v for m, v in results[split].items() if m != "per_question"}, flush=True)
    payload = {"command": getattr(args, "command", ""), "kb": {"passages": len(b.chunks), "bundle": info},
               "calibration": cal, "defaults": {"k": k_cal, "prior": beta_cal, "source": src},
               "params": "greedy, 24 tokens, one user turn; the same retrieval for every mode at its k",
               "results": results, "wall_s": round(time.perf_counter() - t0, 1)}
    res = write("gen_quality_obliqa", payload)
    _plot_obliqa(results)
    return res


def sample(args) -> dict:
    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models
    from softknn.generate.engine import GenParams

    enc, gen = models()
    kb = ROOT / "softknn" / "sample_kb" / "kb"
    t0 = time.perf_counter()
    # the same calibrated fp16 build as gen_serving's (bench/generation.py builds with calibration)
    out = CACHE / ("gen-sample" if args.memory == "fp16" else f"gen-sample-{args.memory}")
    b, info = get_bundle(kb, out, enc, gen, memory=args.memory)
    ge = gen_engine(enc, gen, b)
    cal = (b.manifest.generator.calibration or {}) if b.manifest.generator else {}
    k_cal, beta_cal, src = ge.defaults()
    base = GenParams(max_tokens=32, temperature=0.0)
    modes = {"prompt_at_calibrated_k": {"context": "prompt", "k": k_cal}, "prompt_k4": {"context": "prompt", "k": 4},
             "softknn_calibrated": {}, "softknn_k4_beta4": {"k": 4, "prior": 4.0}}
    results: dict = {}
    for split in ("validation", "test"):
        sq = [q for q in load_qa() if q["split"] == split][: args.limit or None]
        rows: dict[str, list[dict]] = {m: [_ask(ge, replace(base, **kw), q) for q in sq] for m, kw in modes.items()}
        results[split] = {m: _summary(r) for m, r in rows.items()}
        results[split]["per_question"] = rows
        print(split, {m: v for m, v in results[split].items() if m != "per_question"}, flush=True)
    payload = {"command": getattr(args, "command", ""), "kb": {"chunks": len(b.chunks), "bundle": info},
               "calibration": cal, "defaults": {"k": k_cal, "prior": beta_cal, "source": src},
               "params": "greedy, 32 tokens, one user turn; the same retrieval for every mode at its k",
               "results": results, "wall_s": round(time.perf_counter() - t0, 1)}
    return write("gen_quality_sample", payload)


def weights(args) -> dict:
    """The decode graph's weight formats on the same bundle and questions: q4 (the GGUF file's own numbers,
    float activations) against q4a8 (the same blocks, int8 activations per block of 32, as llama.cpp's dot
    products) and fp32; accuracy, answers equal to q4's, and the torch reference's (float32) for scale."""
    from bench.generation import CACHE, gen_engine, get_bundle, load_qa, models
    from softknn.generate.engine import GenEngine, GenParams
    from softknn.retrieval.search import Retriever

    enc, gen = models()
    kb = ROOT / "softknn" / "sample_kb" / "kb"
    b, info = get_bundle(kb, CACHE / "gen-sample", enc, gen)
    ge = gen_engine(enc, gen, b)
    k_cal, beta_cal, _ = ge.defaults()
    settings = {"calibrated": {}, "k4_beta4": {"k": 4, "prior": 4.0}, "k8_beta0": {"k": 8, "prior": 0.0}}
    test = [q for q in load_qa() if q["split"] == "test"][: args.limit or None]
    base = GenParams(max_tokens=32, temperature=0.0)
    runtimes = {w: GenEngine(Retriever(b), enc, gen, weights=w) for w in args.formats.split(",")}
    runtimes["torch"] = GenEngine(Retriever(b), enc, gen, runtime="torch")
    t0 = time.perf_counter()
    out: dict = {}
    for sname, kw in settings.items():
        rows = {w: [_ask(e, replace(base, **kw), q) for q in test] for w, e in runtimes.items()}
        ref = [r["answer"] for r in rows["q4"]] if "q4" in rows else None
        out[sname] = {w: {**_summary(r), **({"same_answer_as_q4": round(sum(a["answer"] == x for a, x in zip(r, ref))
                                                                       / len(r), 4)} if ref else {})}
                      for w, r in rows.items()}
        out[sname]["per_question"] = rows
        print(sname, {w: v for w, v in out[sname].items() if w != "per_question"}, flush=True)
    payload = {"command": getattr(args, "command", ""), "bundle": info, "questions": len(test),
               "calibrated": {"k": k_cal, "prior": beta_cal}, "params": "greedy, 32 tokens, one user turn, joint",
               "settings": out, "wall_s": round(time.perf_counter() - t0, 1)}
    return write("gen_quality_weights", payload)


def _built(kb: str, enc, split: str, limit: int):
    """The bundle `gen_build` builds for `kb` (sample or obliqa; built now when absent) and the QA
    questions of `split` for it (the first `limit`, 0 = all)."""
    from bench.gen_build import run as build
    from bench.generation import CACHE, load_qa
    from softknn.storage.bundle import load_bundle

    path = CACHE / f"gen-build-{kb}"
    if not (path / "manifest.json").exists():
        build(argparse.Namespace(kb=kb, passages=1000, memory="", command="python -m bench gen_build --kb " + kb))
    b = load_bundle(path, expected_fingerprint=enc.info.fingerprint)
    if kb == "sample":
        qs = [q for q in load_qa() if q["split"] == split]
    else:
        qs = [q for q in (json.loads(x) for x in QA_OBLIQA.read_text().splitlines() if x.strip()) if q["split"] == split]
    return b, qs[: limit or None]


def kv(args) -> dict:
    """The decode graph's KV cache formats on the same bundles, questions and weights: int8 (a fixed scale
    per layer and channel) against fp32; accuracy, answers equal to fp32's and the items right in one
    only, at the calibrated default and at k 4 and 8 (β as calibrated at that k)."""
    return _pair(args, "kv_cache", ("fp32", "int8"), "gen_quality_kv",
                 "greedy, one user turn, refusal off, the decode graph with the default weights, one thread")


def wformats(args) -> dict:
    """The decode graph's weight formats on the same bundles, questions and (default int8) KV cache: w8a8
    (int8 per output channel, int8 activations per token) against q4a8 (the GGUF file's 4-bit blocks, int8
    activations per block of 32); as `kv`."""
    a, b = args.formats.split(",")
    name = "gen_quality_wformats" + ("" if args.split == "test" else f"_{args.split}")
    return _pair(args, "weights", (a, b), name,
                 "greedy, one user turn, refusal off, the decode graph with the default KV cache, one thread")


def _pair(args, field: str, formats: tuple[str, str], name: str, params: str) -> dict:
    """The same answers with GenEngine(**{field: a}) and GenEngine(**{field: b}) on each KB of args.kbs."""
    from bench.generation import models
    from softknn.generate.engine import GenEngine, GenParams
    from softknn.retrieval.search import Retriever

    enc, gen = models()
    fa, fb = formats
    out: dict = {}
    t0 = time.perf_counter()
    for kb in args.kbs.split(","):
        b, qs = _built(kb, enc, getattr(args, "split", "test"), args.limit)
        engines = {f: GenEngine(Retriever(b), enc, gen, **{field: f}) for f in formats}
        k_cal, beta_cal, _ = engines[fa].defaults()
        base = GenParams(max_tokens=args.max_tokens, temperature=0.0, refuse=False)
        out[kb] = {"chunks": len(b.chunks), "calibrated": {"k": k_cal, "prior": beta_cal}, "settings": {}}
        for sname, kw in {"calibrated": {}, "k4": {"k": 4}, "k8": {"k": 8}}.items():
            rows = {f: [_ask(e, replace(base, **kw), q) for q in qs] for f, e in engines.items()}
            a, c = rows[fa], rows[fb]
            out[kb]["settings"][sname] = {
                **{f: _summary(r) for f, r in rows.items()},
                "same_answer": round(sum(x["answer"] == y["answer"] for x, y in zip(a, c, strict=True)) / len(a), 4),
                f"right_only_{fa}": sum(x["correct"] and not y["correct"] for x, y in zip(a, c, strict=True)),
                f"right_only_{fb}": sum(y["correct"] and not x["correct"] for x, y in zip(a, c, strict=True)),
                "per_question": rows}
            print(kb, sname, {k: v for k, v in out[kb]["settings"][sname].items() if k != "per_question"}, flush=True)
    payload = {"command": getattr(args, "command", ""), "max_tokens": args.max_tokens, "compared": {field: list(formats)},
               "split": getattr(args, "split", "test"),
               "params": params, "results": out, "wall_s": round(time.perf_counter() - t0, 1)}
    return write(name, payload)


def _ask_timed(ge, params, q: dict) -> dict:
    """_ask with the time to the first token (the stream's first Step)."""
    from bench.generation import msgs
    from softknn.generate.model import Step

    t0 = time.perf_counter()
    ttft, answer = None, None
    for item in ge.stream(params, messages=msgs(q["question"])):
        if isinstance(item, Step):
            ttft = ttft if ttft is not None else time.perf_counter() - t0
        else:
            answer = item
    assert answer is not None
    return {"id": q["id"], "answer": answer.text.strip(), "correct": _correct(answer.text, q),
            "k": answer.diagnostics["k"], "prior": answer.diagnostics.get("prior"),
            "ttft_s": round(ttft if ttft is not None else time.perf_counter() - t0, 4)}


def multichunk(args) -> dict:
    """Memory against prompt-stuffed RAG at k 4 and 8 (and the calibrated default against the prompt at
    its k) on the sample KB and the ObliQA KB, the decode graph with the default weights, greedy, with
    the time to first token; the bundles as a user builds them (bench/gen_build.py's)."""
    import statistics

    from bench.generation import gen_engine, models
    from softknn.generate.engine import GenParams

    enc, gen = models()
    out: dict = {}
    t0 = time.perf_counter()
    for kb in args.kbs.split(","):
        b, qs = _built(kb, enc, args.split, args.limit)
        ge = gen_engine(enc, gen, b)
        k_cal, beta_cal, _ = ge.defaults()
        base = GenParams(max_tokens=args.max_tokens, temperature=0.0, refuse=False)
        modes = {"calibrated": {}, f"prompt_k{k_cal}": {"context": "prompt", "k": k_cal}}
        for k in (4, 8):
            modes |= {f"memory_k{k}": {"k": k}, f"prompt_k{k}": {"context": "prompt", "k": k}}
        ge.answer(replace(base, max_tokens=2), messages=[{"role": "user", "content": qs[0]["question"]}])  # warm-up
        rows: dict[str, list[dict]] = {m: [] for m in modes}
        for q in qs:  # interleaved: every mode on a question before the next question
            for m, kw in modes.items():
                rows[m].append(_ask_timed(ge, replace(base, **kw), q))
        out[kb] = {"chunks": len(b.chunks), "calibrated": {"k": k_cal, "prior": beta_cal},
                   "modes": {m: {**_summary(r), "ttft_p50_s": round(statistics.median(x["ttft_s"] for x in r), 4)}
                             for m, r in rows.items()},
                   "per_question": rows}
        print(kb, json.dumps(out[kb]["modes"]), flush=True)
    payload = {"command": getattr(args, "command", ""), "max_tokens": args.max_tokens, "split": args.split,
               "params": "greedy, one user turn, refusal off (every question answered), the decode graph with the "
                         "default weights, one thread; memory at k uses the bundle's calibrated β",
               "results": out, "wall_s": round(time.perf_counter() - t0, 1)}
    return write("gen_quality_multichunk" + ("" if args.split == "test" else f"_{args.split}"), payload)


def _gold_only(ge, params, q: dict, rows: list[int]) -> dict:
    """The question answered with R forced to the gold passage's chunks (weights uniform): memory or prompt."""
    from bench.generation import msgs

    orig = ge.retrieve

    def forced(query, p):
        retr = orig(query, replace(p, k=1))
        retr.rows[0] = list(rows)
        retr.weights[0] = [1.0 / len(rows)] * len(rows)
        retr.scores[0] = [1.0] * len(rows)
        retr.dense[0] = [0.0] * len(rows)
        if retr.bm25[0] is not None:
            retr.bm25[0] = [0.0] * len(rows)
        return retr

    ge.retrieve = forced
    try:
        a = ge.answer(replace(params, k=len(rows)), messages=msgs(q["question"]))
    finally:
        del ge.retrieve
    return {"id": q["id"], "answer": a.text.strip(), "correct": _correct(a.text, q), "k": len(rows)}


def _plot_obliqa(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in results["test"] if m not in ("per_question", "gold_in_R_calibrated")]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for j, split in enumerate(("validation", "test")):
        ax.bar([i + 0.4 * j for i in range(len(modes))], [results[split][m]["accuracy"] for m in modes], width=0.4,
               label=split, yerr=[results[split][m]["se"] for m in modes])
    ax.set_xticks([i + 0.2 for i in range(len(modes))], modes, rotation=35, ha="right", fontsize=8)
    ax.set(ylabel="accuracy", title="ObliQA short answers: softknn's calibrated default vs prompt-stuffed RAG")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "gen_quality_obliqa.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="part", required=True)
    mc = sub.add_parser("multichunk", help="memory vs prompt at k 4 and 8 with TTFT, on the sample and ObliQA KBs")
    mc.add_argument("--kbs", default="sample,obliqa")
    mc.add_argument("--max-tokens", type=int, default=24)
    mc.add_argument("--limit", type=int, default=0)
    mc.add_argument("--split", default="test", help="test, or validation (→ gen_quality_multichunk_validation.json)")
    kvp = sub.add_parser("kv", help="the decode graph's KV cache formats (int8 vs fp32) on the same answers")
    kvp.add_argument("--kbs", default="sample,obliqa")
    kvp.add_argument("--max-tokens", type=int, default=24)
    kvp.add_argument("--limit", type=int, default=0)
    wf = sub.add_parser("wformats", help="two decode-graph weight formats (default q4a8 vs w8a8) on the same answers")
    wf.add_argument("--formats", default="q4a8,w8a8")
    wf.add_argument("--kbs", default="sample,obliqa")
    wf.add_argument("--max-tokens", type=int, default=24)
    wf.add_argument("--limit", type=int, default=0)
    wf.add_argument("--split", default="test", help="test, or validation (→ gen_quality_wformats_validation.json)")
    w = sub.add_parser("weights", help="the decode graph's weight formats (q4, q4a8, fp32) on the same answers")
    w.add_argument("--formats", default="q4,q4a8,fp32")
    w.add_argument("--limit", type=int, default=0)
    m = sub.add_parser("memory", help="bytes per token and sample-QA accuracy per generator memory")
    m.add_argument("--variants", default="fp16,int8,q4,q2,q4@0.5,q4@0.3,q2@0.5")
    m.add_argument("--limit", type=int, default=0)
    o = sub.add_parser("obliqa", help="calibrated defaults vs prompt-stuffed RAG on ObliQA short answers")
    o.add_argument("--passages", type=int, default=1000)
    o.add_argument("--memory", default="fp16")
    o.add_argument("--limit", type=int, default=0)
    s = sub.add_parser("sample", help="calibrated defaults vs prompt-stuffed RAG on the sample KB")
    s.add_argument("--memory", default="fp16")
    s.add_argument("--limit", type=int, default=0)


def run(args: argparse.Namespace) -> dict:
    from bench.generation import setup_threads

    setup_threads()
    return {"memory": memory, "obliqa": obliqa, "sample": sample, "weights": weights,
            "multichunk": multichunk, "kv": kv, "wformats": wformats}[args.part](args)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["gen_quality", *sys.argv[1:]])
