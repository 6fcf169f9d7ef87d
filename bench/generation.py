"""Generation with the KB in attention (softknn.generate.engine) vs prompt-stuffed RAG vs the plain model.

Four parts, each its own subcommand and result file (bench/results/generation_<part>.json + .png):

- `answers`: the sample KB's QA set (softknn/sample_kb/qa.jsonl; 24 validation, 95 test questions),
  greedy, max_tokens 32, k = 4, the bundle's default (hybrid) retrieval. Modes: no KB, prompt-stuffed
  RAG (context "prompt": the same R's text in the prompt), softknn joint, softknn fixed (α chosen on
  validation from {0.5, 0.7, 0.8, 0.9}), positions composite; joint with positions "reordered" on
  validation (and on test too when it wins validation by more than --reordered-margin). Accuracy:
  the reference or an alias appears in the normalised answer on word boundaries; token F1 (SQuAD)
  against the reference; retrieval recall (a gold id among R's chunk ids / doc ids).
- `obliqa`: mean NLL per token of the gold passage's first 64 generator tokens teacher-forced after
  the question (`GenEngine.score`), R from the bundle's own hybrid retrieval (k = 4), on a ~1000
  passage ObliQA KB (gold passages of the first questions plus distractors from their documents),
  generator memory "recompute": no KB, prompt-stuffed, joint, fixed at the α of `answers`.
- `speed`: time to first token (prefill + first token, wall) and decode tokens/s at k = 4, 8, 16,
  softknn joint (fp16 store) vs prompt-stuffed, interleaved, medians; retrieval time on its own.
- `memory`: generator-memory bytes per chunk for layer sets {all, last 15, every 3rd} × {fp32,
  fp16, int8} (formula, checked against built bundles) and validation accuracy of four builds.

Run (repository root, the project venv, HF_HUB_OFFLINE=1):

    python bench/generation.py answers
    python bench/generation.py obliqa [--questions 100] [--passages 1000]
    python bench/generation.py speed [--questions 10] [--repeats 3]
    python bench/generation.py memory

Bundles are cached under /tmp/softknn-bench (gen-sample, obliqa-gen, gen-mem-*), reused when they
verify. One torch thread throughout (the box is shared).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench.common import RESULTS, write

ROOT = Path(__file__).resolve().parents[1]

CACHE = Path("/tmp/softknn-bench")
QA = ROOT / "softknn" / "sample_kb" / "qa.jsonl"
OBLIQA = ROOT.parent / "shared" / "data" / "obliqa_dev"
ALPHAS = (0.5, 0.7, 0.8, 0.9)
LLAMA_CPP_NOTE = ("not run in this part: the llama_cpp part runs prompt-stuffed RAG in llama.cpp on these prompts "
                  "(llama-cpp-python has no binary wheel here and is compiled from source in its own venv)")
COMMAND = "python " + " ".join(shlex.quote(a) for a in sys.argv)  # replaced by the runner's args.command in run()


# --- scoring ---------------------------------------------------------------------------------------
def normalise(s: str) -> str:
    """lowercase; '.' kept only inside numbers; '$' and ':' kept; other punctuation → space; spaces collapsed."""
    s = s.lower()
    s = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", s)
    s = re.sub(r"[^\w\s.$:]|_", " ", s)
    return " ".join(s.split())


def _match_form(s: str) -> str:
    return " ".join(normalise(s).replace("$", " ").split())  # "$9.50" and "9.50" alike


def contains(answer: str, ref: str) -> bool:
    a, r = _match_form(answer), _match_form(ref)
    if not r:
        return False
    # word boundaries: "2" is not in "12", nor "9" in "9.50"
    return re.search(r"(?<![\w.])" + re.escape(r) + r"(?!\w|\.\d)", a) is not None


def token_f1(answer: str, ref: str) -> float:
    a, r = _match_form(answer).split(), _match_form(ref).split()
    common = Counter(a) & Counter(r)
    same = sum(common.values())
    if not a or not r or same == 0:
        return float(a == r)
    p, rc = same / len(a), same / len(r)
    return 2 * p * rc / (p + rc)


def correct(answer: str, q: dict) -> bool:
    return any(contains(answer, r) for r in [q["answer"], *q.get("aliases", [])])


# --- setup -----------------------------------------------------------------------------------------
def setup_threads() -> None:
    import torch

    torch.set_num_threads(1)
    import faiss

    faiss.omp_set_num_threads(1)


def get_bundle(kb: Path, out: Path, enc, gen, layers: str = "all", memory: str = "fp16", **cfg_kw) -> tuple[object, dict]:
    """The bundle at `out` (built once; reused when it verifies and holds this generator memory)."""
    from softknn.common.errors import SoftKNNError
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.storage.bundle import load_bundle

    want_layers = gen.layers(layers)
    info = {"path": str(out), "built": False, "build_s": None}
    if out.exists():
        try:
            b = load_bundle(out, expected_fingerprint=enc.info.fingerprint)
            g = b.manifest.generator
            if g is not None and g.memory == memory and list(g.layers) == want_layers and g.fingerprint == gen.info.fingerprint:
                return b, info
        except SoftKNNError:
            pass
    t0 = time.perf_counter()
    build_bundle(kb, out, BuildConfig(generator_layers=layers, generator_memory=memory, **cfg_kw), enc,
                 generator=gen, force=True, progress=False)
    info.update(built=True, build_s=round(time.perf_counter() - t0, 1))
    return load_bundle(out, expected_fingerprint=enc.info.fingerprint), info


def models():
    from softknn.generate.model import Generator
    from softknn.model.encoder import Encoder

    return Encoder(), Generator.load()


def gen_engine(enc, gen, bundle):
    from softknn.generate.engine import GenEngine
    from softknn.retrieval.search import Retriever

    return GenEngine(Retriever(bundle), enc, gen)


def load_qa() -> list[dict]:
    return [json.loads(x) for x in QA.read_text().splitlines() if x.strip()]


def msgs(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def gold_hit(q: dict, evidence) -> bool:
    ids = set()
    for ev in evidence:
        ids.update({ev.chunk_id, ev.doc_id, ev.chunk_id.split("#")[0]})
    return any(g in ids for g in q["gold_ids"])


# --- 1. answers ------------------------------------------------------------------------------------
def sample_setup(limit: int = 0):
    """The models, the sample bundle with the generator (built once), its GenEngine, and the QA
    set's validation and test questions (the first `limit` of each; 0: all)."""
    enc, gen = models()
    bundle, binfo = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    qa = load_qa()
    val = [q for q in qa if q["split"] == "validation"][: limit or None]
    test = [q for q in qa if q["split"] == "test"][: limit or None]
    return enc, gen, gen_engine(enc, gen, bundle), binfo, val, test


def run_modes(ge, qs: list[dict], modes: dict, base) -> dict:
    out = {name: [] for name in modes}
    for q in qs:
        for name, p in modes.items():
            t0 = time.perf_counter()
            a = ge.answer(replace(base, **p), messages=msgs(q["question"]))
            text = a.text.strip()
            row = {"id": q["id"], "answer": text, "correct": correct(text, q), "f1": round(token_f1(text, q["answer"]), 4),
                   "finish": a.finish_reason, "s": round(time.perf_counter() - t0, 2)}
            if p.get("use_kb", True):
                row["R"] = [ev.chunk_id for ev in sorted(a.evidence, key=lambda e: -e.weight)]
                row["gold_in_R"] = gold_hit(q, a.evidence)
                row["memory_share"] = round(a.diagnostics["memory_share"], 4)
            out[name].append(row)
    return out


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    s = {"n": n, "accuracy": round(sum(r["correct"] for r in rows) / n, 4), "f1": round(sum(r["f1"] for r in rows) / n, 4),
         "correct": sum(r["correct"] for r in rows)}
    if rows and "gold_in_R" in rows[0]:
        s["gold_in_R"] = round(sum(r["gold_in_R"] for r in rows) / n, 4)
    return s


def answers(args) -> None:
    from softknn.generate.engine import GenParams

    enc, gen, ge, binfo, val, test = sample_setup(args.limit)
    base = GenParams(max_tokens=32, temperature=0.0, k=4)
    t0 = time.perf_counter()
    vmodes = {"no_kb": {"use_kb": False}, "prompt": {"context": "prompt"}, "joint": {"mixing": "joint"},
              **{f"fixed_{a}": {"mixing": "fixed", "alpha": a} for a in ALPHAS},
              "joint_reordered": {"mixing": "joint", "positions": "reordered"}}
    vrows = run_modes(ge, val, vmodes, base)
    vsum = {m: summarise(r) for m, r in vrows.items()}
    # α: best validation accuracy, then F1, ties to the larger α (closer to the model's own context)
    alpha = max(ALPHAS, key=lambda a: (vsum[f"fixed_{a}"]["accuracy"], vsum[f"fixed_{a}"]["f1"], a))
    reord_wins = vsum["joint_reordered"]["accuracy"] - vsum["joint"]["accuracy"] > args.reordered_margin
    tmodes = {"no_kb": {"use_kb": False}, "prompt": {"context": "prompt"}, "joint": {"mixing": "joint"},
              "fixed": {"mixing": "fixed", "alpha": alpha}}
    if reord_wins:
        tmodes["joint_reordered"] = vmodes["joint_reordered"]
    trows = run_modes(ge, test, tmodes, base)
    tsum = {m: summarise(r) for m, r in trows.items()}
    payload = {
        "command": COMMAND, "bundle": binfo, "generator": gen.info.name, "encoder": enc.info.name,
        "params": {"max_tokens": 32, "greedy": True, "k": 4, "retrieval": "bundle default (hybrid)", "positions": "composite"},
        "load": "see machine.loadavg", "subsample": args.limit or None,
        "scoring": "accuracy: reference or alias in the normalised answer on word boundaries ($ dropped for matching); "
                   "f1: SQuAD token F1 vs the reference",
        "alpha_sweep_validation": {str(a): vsum[f"fixed_{a}"] for a in ALPHAS}, "alpha_chosen": alpha,
        "reordered_vs_composite_validation": {"composite": vsum["joint"], "reordered": vsum["joint_reordered"],
                                              "reordered_run_on_test": reord_wins, "margin": args.reordered_margin},
        "validation": vsum, "test": tsum, "wall_s": round(time.perf_counter() - t0, 1),
        "per_question": {"validation": vrows, "test": trows},
    }
    name = "generation_answers" + (f"_{args.name}" if args.name else "")
    out = write(name, payload)
    plot_grouped(name, ["no_kb", "prompt", "joint", "fixed"], {"validation": vsum | {"fixed": vsum[f"fixed_{alpha}"]}, "test": tsum},
                 "accuracy", f"sample KB QA accuracy (k=4, fixed α={alpha})")
    print(out, json.dumps({"validation": vsum, "test": tsum, "alpha": alpha}, indent=1))
    return payload


def answers_k(args) -> dict:
    """k chosen on validation for each way of giving the model the KB (prompt-stuffed, joint), then test."""
    from softknn.generate.engine import GenParams

    enc, gen, ge, binfo, val, test = sample_setup(args.limit)
    ks = [int(x) for x in args.ks.split(",")]
    methods = {"prompt": {"context": "prompt"}, "joint": {"mixing": "joint"}}
    t0 = time.perf_counter()
    sweep: dict = {}
    for k in ks:
        rows = run_modes(ge, val, methods, GenParams(max_tokens=32, temperature=0.0, k=k))
        for m, r in rows.items():
            sweep.setdefault(m, {})[str(k)] = summarise(r)
    # best validation accuracy, then F1; a tie goes to the larger k (more of R in the evidence)
    chosen = {m: max(ks, key=lambda k, m=m: (sweep[m][str(k)]["accuracy"], sweep[m][str(k)]["f1"], k)) for m in methods}
    trows = {}
    for m, p in methods.items():
        trows[m] = run_modes(ge, test, {m: p}, GenParams(max_tokens=32, temperature=0.0, k=chosen[m]))[m]
    tsum = {m: summarise(r) for m, r in trows.items()}
    payload = {"command": COMMAND, "bundle": binfo, "generator": gen.info.name, "ks": ks,
               "validation_sweep": sweep, "k_chosen": chosen, "test": tsum,
               "params": {"max_tokens": 32, "greedy": True, "retrieval": "bundle default (hybrid)", "positions": "composite"},
               "wall_s": round(time.perf_counter() - t0, 1), "per_question": {"test": trows}}
    out = write("generation_answers_k", payload)
    plot_grouped("generation_answers_k", [str(k) for k in ks],
                 {m: {str(k): sweep[m][str(k)] for k in ks} for m in methods}, "accuracy",
                 "validation accuracy by k (prompt-stuffed vs softknn joint)", "accuracy")
    print(out, json.dumps({"validation": sweep, "chosen": chosen, "test": tsum}, indent=1))
    return payload


def answers_prior(args) -> dict:
    """softknn joint with the w_db prior β (softknn.generate.attention): (k, β) chosen on validation, then test."""
    from softknn.generate.engine import GenParams

    enc, gen, ge, binfo, val, test = sample_setup(args.limit)
    ks = [int(x) for x in args.ks.split(",")]
    betas = [float(x) for x in args.priors.split(",")]
    t0 = time.perf_counter()
    sweep: dict = {}
    for k in ks:
        for beta in betas:
            rows = run_modes(ge, val, {"joint": {"mixing": "joint", "prior": beta}},
                             GenParams(max_tokens=32, temperature=0.0, k=k))["joint"]
            sweep[f"k={k},prior={beta:g}"] = summarise(rows) | {"k": k, "prior": beta}
    # best validation accuracy, then F1; a tie to the smaller β (closer to the plain joint softmax), then larger k
    best = max(sweep.values(), key=lambda s: (s["accuracy"], s["f1"], -s["prior"], s["k"]))
    trows = run_modes(ge, test, {"joint": {"mixing": "joint", "prior": best["prior"]}},
                      GenParams(max_tokens=32, temperature=0.0, k=best["k"]))["joint"]
    payload = {"command": COMMAND, "bundle": binfo, "generator": gen.info.name, "ks": ks, "priors": betas,
               "validation_sweep": sweep, "chosen": {"k": best["k"], "prior": best["prior"]},
               "test": {"joint_prior": summarise(trows)},
               "params": {"max_tokens": 32, "greedy": True, "retrieval": "bundle default (hybrid)", "positions": "composite"},
               "wall_s": round(time.perf_counter() - t0, 1), "per_question": {"test": trows}}
    out = write("generation_answers_prior", payload)
    plot_grouped("generation_answers_prior", [f"{b:g}" for b in betas],
                 {f"k={k}": {f"{b:g}": sweep[f"k={k},prior={b:g}"] for b in betas} for k in ks}, "accuracy",
                 "softknn joint, validation accuracy by the w_db prior β", "accuracy")
    print(out, json.dumps({"validation": sweep, "chosen": payload["chosen"], "test": payload["test"]}, indent=1))
    return payload


def plot_grouped(name: str, labels: list[str], groups: dict, key: str, title: str, ylabel: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.8 / len(groups)
    for gi, (g, summ) in enumerate(groups.items()):
        xs = [i + gi * w for i in range(len(labels))]
        vals = [summ[m][key] if m in summ else 0 for m in labels]
        ax.bar(xs, vals, w, label=f"{g} (n={next(iter(summ.values())).get('n', '')})")
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + w * (len(groups) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_ylabel(ylabel or key)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


# --- 2. obliqa -------------------------------------------------------------------------------------
def obliqa_kb(n_questions: int, n_passages: int, seed: int = 0) -> tuple[Path, list[dict]]:
    """A JSONL of ~n_passages passages: the gold passages of the first questions (those whose gold
    passage is non-trivial) plus distractors from the same documents; and the questions used."""
    docs: dict[int, list[dict]] = {}
    for f in sorted((OBLIQA / "documents").glob("*.json")):
        for p in json.loads(f.read_text()):
            docs.setdefault(p["DocumentID"], []).append(p)
    by_key = {(p["DocumentID"], p["PassageID"]): p for ps in docs.values() for p in ps}
    qs_all = json.loads((OBLIQA / "questions.json").read_text())
    chosen, gold_keys = [], []
    for q in qs_all:
        g = q["Passages"][0]
        key = (g["DocumentID"], g["PassageID"])
        if key not in by_key or len(by_key[key]["Passage"]) < 200:
            continue  # the gold must be in the documents and long enough for 64 tokens
        chosen.append({"id": q["QuestionID"], "question": q["Question"], "gold": by_key[key]["ID"],
                       "gold_keys": [by_key[(p["DocumentID"], p["PassageID"])]["ID"] for p in q["Passages"]
                                     if (p["DocumentID"], p["PassageID"]) in by_key],
                       "gold_text": by_key[key]["Passage"]})
        gold_keys += chosen[-1]["gold_keys"]
        if len(chosen) == n_questions:
            break
    keep = {k: None for k in gold_keys}
    doc_ids = sorted({p["DocumentID"] for p in by_key.values() if p["ID"] in keep})
    pool = [p for d in doc_ids for p in docs[d] if p["ID"] not in keep and len(p["Passage"]) >= 40]
    random.Random(seed).shuffle(pool)
    rows = [p for p in by_key.values() if p["ID"] in keep]
    rows += pool[: max(0, n_passages - len(rows))]
    out = CACHE / "obliqa-gen" / "kb.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"id": p["ID"], "text": p["Passage"]}, ensure_ascii=False) + "\n" for p in rows)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out, chosen


def obliqa(args) -> None:
    from softknn.generate.engine import GenParams

    prev = json.loads((RESULTS / "generation_answers.json").read_text()) if (RESULTS / "generation_answers.json").exists() else {}
    alpha = args.alpha if args.alpha is not None else prev.get("alpha_chosen", 0.7)
    enc, gen = models()
    kb, qs = obliqa_kb(args.questions, args.passages)
    bundle, binfo = get_bundle(kb, CACHE / "obliqa-gen" / "bundle", enc, gen, memory="recompute")
    ge = gen_engine(enc, gen, bundle)
    base = GenParams(k=4)
    modes = {"no_kb": {"use_kb": False}, "prompt": {"context": "prompt"}, "joint": {"mixing": "joint"},
             "fixed": {"mixing": "fixed", "alpha": alpha}}
    rows = []
    t0 = time.perf_counter()
    for q in qs:
        cont = gen.tokenizer.decode(gen._ids(q["gold_text"])[:64], skip_special_tokens=True)
        retr = ge.retrieve(q["question"], base)
        R = [bundle.chunks[r]["doc_id"] for r in retr.rows[0]]
        row = {"id": q["id"], "gold": q["gold"], "R": R, "gold_in_R": q["gold"] in R,
               "any_gold_in_R": any(g in R for g in q["gold_keys"]), "continuation_tokens": len(gen._ids(cont))}
        for m, p in modes.items():
            row[m] = round(ge.score(replace(base, **p), cont, messages=msgs(q["question"])), 5)
        rows.append(row)
    n = len(rows)
    summ = {m: {"mean_nll": round(statistics.fmean(r[m] for r in rows), 4),
                "median_nll": round(statistics.median(r[m] for r in rows), 4)} for m in modes}
    for m in ("prompt", "joint", "fixed"):
        summ[m]["beats_no_kb"] = round(sum(r[m] < r["no_kb"] for r in rows) / n, 4)
        for sub, key in (("gold_in_R", True), ("gold_not_in_R", False)):
            sel = [r[m] for r in rows if r["gold_in_R"] is key]
            summ[m][f"mean_nll_{sub}"] = round(statistics.fmean(sel), 4) if sel else None
    summ["no_kb"]["mean_nll_gold_in_R"] = round(statistics.fmean([r["no_kb"] for r in rows if r["gold_in_R"]] or [0]), 4)
    summ["no_kb"]["mean_nll_gold_not_in_R"] = round(statistics.fmean([r["no_kb"] for r in rows if not r["gold_in_R"]] or [0]), 4)
    payload = {
        "command": COMMAND, "bundle": binfo, "kb": {"path": str(kb), "passages": sum(1 for _ in kb.open()), "chunks": len(bundle.chunks),
                                                     "source": str(OBLIQA)},
        "questions": n, "alpha": alpha, "k": 4, "retrieval": "bundle default (hybrid)", "continuation": "gold passage, first 64 generator tokens, decoded",
        "gold_in_R": round(sum(r["gold_in_R"] for r in rows) / n, 4),
        "any_gold_in_R": round(sum(r["any_gold_in_R"] for r in rows) / n, 4),
        "summary": summ, "wall_s": round(time.perf_counter() - t0, 1), "per_question": rows,
    }
    out = write("generation_obliqa", payload)
    from bench.common import plot_bars

    plot_bars("generation_obliqa", list(modes), [summ[m]["mean_nll"] for m in modes], None, "mean NLL / token",
              f"ObliQA gold passage NLL (n={n}, k=4, gold in R {payload['gold_in_R']:.0%})")
    print(out, json.dumps(summ, indent=1), payload["gold_in_R"])


# --- 3. speed --------------------------------------------------------------------------------------
def speed(args) -> None:
    from softknn.generate.engine import GenParams
    from softknn.generate.model import Step

    enc, gen = models()
    bundle, binfo = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    ge = gen_engine(enc, gen, bundle)
    qs = [q for q in load_qa() if q["split"] == "test"][: args.questions]
    ks = [int(x) for x in args.ks.split(",")]
    base = GenParams(max_tokens=16, temperature=0.0)
    ge.answer(base, messages=msgs(qs[0]["question"]))  # warm-up
    ge.answer(replace(base, context="prompt"), messages=msgs(qs[0]["question"]))
    runs = {k: {"memory": [], "prompt": [], "retrieval_s": []} for k in ks}
    t_start = time.perf_counter()
    for rep in range(args.repeats):
        for k in ks:
            for q in qs:
                t0 = time.perf_counter()
                ge.retrieve(q["question"], replace(base, k=k))
                runs[k]["retrieval_s"].append(time.perf_counter() - t0)
                order = ("memory", "prompt") if rep % 2 == 0 else ("prompt", "memory")
                for ctx in order:
                    p = replace(base, k=k, context=ctx)
                    t0 = time.perf_counter()
                    t_first, n = None, 0
                    ans = None
                    for item in ge.stream(p, messages=msgs(q["question"])):
                        if isinstance(item, Step):
                            n += 1
                            if t_first is None:
                                t_first = time.perf_counter()
                        else:
                            ans = item
                    t_end = time.perf_counter()
                    if t_first is None:  # EOS as the first token: no Step; the prefill is all there was
                        t_first = t_end
                    runs[k][ctx].append({"q": q["id"], "ttft_s": t_first - t0, "decode_s": t_end - t_first, "tokens": n,
                                         "decode_tok_s": (n - 1) / (t_end - t_first) if n > 1 and t_end > t_first else None,
                                         "prompt_tokens": ans.usage["prompt_tokens"],
                                         "memory_tokens": ans.diagnostics["memory_tokens"]})
    summ = {}
    for k in ks:
        s = {}
        for ctx in ("memory", "prompt"):
            r = runs[k][ctx]
            s[ctx] = {"ttft_median_s": round(statistics.median(x["ttft_s"] for x in r), 4),
                      "ttft_min_s": round(min(x["ttft_s"] for x in r), 4), "ttft_max_s": round(max(x["ttft_s"] for x in r), 4),
                      "decode_tok_s_median": round(statistics.median(x["decode_tok_s"] for x in r if x["decode_tok_s"]), 2),
                      "prompt_tokens_median": statistics.median(x["prompt_tokens"] for x in r),
                      "memory_tokens_median": statistics.median(x["memory_tokens"] for x in r)}
        s["retrieval_median_s"] = round(statistics.median(runs[k]["retrieval_s"]), 4)
        s["ttft_ratio_memory_over_prompt"] = round(s["memory"]["ttft_median_s"] / s["prompt"]["ttft_median_s"], 3)
        s["decode_ratio_memory_over_prompt"] = round(s["memory"]["decode_tok_s_median"] / s["prompt"]["decode_tok_s_median"], 3)
        summ[str(k)] = s
    payload = {"command": COMMAND, "bundle": binfo, "questions": len(qs), "repeats": args.repeats, "max_tokens": 16,
               "memory": "stored fp16, all layers, joint, composite", "timing": "wall; ttft includes retrieval, placing R's K/V, "
               "prefill and the first token; decode tok/s over the remaining tokens; interleaved per question (order alternates by repeat)",
               "llama_cpp": args.llama_cpp_note, "summary": summ, "wall_s": round(time.perf_counter() - t_start, 1),
               "runs": {str(k): v for k, v in runs.items()}}
    out = write("generation_speed", payload)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ctx in ("memory", "prompt"):
        axes[0].plot(ks, [summ[str(k)][ctx]["ttft_median_s"] * 1000 for k in ks], marker="o", label=f"softknn {ctx}" if ctx == "memory" else "prompt-stuffed")
        axes[1].plot(ks, [summ[str(k)][ctx]["decode_tok_s_median"] for k in ks], marker="o", label=f"softknn {ctx}" if ctx == "memory" else "prompt-stuffed")
    axes[0].plot(ks, [summ[str(k)]["retrieval_median_s"] * 1000 for k in ks], marker="x", ls="--", label="retrieval alone")
    axes[0].set(xlabel="k", ylabel="TTFT median (ms)", title="time to first token")
    axes[1].set(xlabel="k", ylabel="tokens/s (median)", title="decode speed")
    for a in axes:
        a.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "generation_speed.png", dpi=110)
    plt.close(fig)
    print(out, json.dumps(summ, indent=1))


# --- 4. memory -------------------------------------------------------------------------------------
LAYER_SETS = {"all": "all", "last15": ",".join(str(i) for i in range(15, 30)), "every3rd": ",".join(str(i) for i in range(0, 30, 3))}
BYTES = {"fp32": 4, "fp16": 2, "int8": 1}


def llama_cpp(args) -> dict:
    """Prompt-stuffed RAG in llama.cpp on the same prompts as `speed` (the same R's text, the same
    template), beside softknn's figures from generation_speed.json: TTFT and decode tokens/s."""
    import subprocess

    from softknn.generate.engine import GenParams
    from softknn.generate.model import PACKAGED_GGUF, resolve_generator

    enc, gen = models()
    bundle, binfo = get_bundle(ROOT / "softknn" / "sample_kb" / "kb", CACHE / "gen-sample", enc, gen)
    ge = gen_engine(enc, gen, bundle)
    qs = [q for q in load_qa() if q["split"] == "test"][: args.questions]
    ks = [int(x) for x in args.ks.split(",")]
    prompts = []
    for k in ks:
        for q in qs:
            prep = ge.prepare(GenParams(max_tokens=16, k=k, context="prompt"), None, msgs(q["question"]))
            prompts.append({"k": k, "q": q["id"], "prompt": gen.tokenizer.decode(prep.prefix + prep.rest),
                            "hf_tokens": len(prep.prefix) + len(prep.rest)})
    CACHE.mkdir(parents=True, exist_ok=True)
    pin, pout = CACHE / "llama_prompts.json", CACHE / "llama_out.json"
    pin.write_text(json.dumps(prompts))
    folder, gguf = resolve_generator("smollm2-135m-instruct")
    assert gguf == PACKAGED_GGUF[1]
    t0 = time.perf_counter()
    subprocess.run([args.python, str(ROOT / "bench" / "llama_cpp_worker.py"), str(folder / gguf), str(pin), str(pout),
                    "16", str(args.repeats)], check=True)
    rows = json.loads(pout.read_text())
    speed_json = json.loads((RESULTS / "generation_speed.json").read_text())["summary"]
    summ = {}
    for k in ks:
        r = [x for x in rows if x["k"] == k]
        dec = [(x["tokens"] - 1) / x["decode_s"] for x in r if x["tokens"] > 1 and x["decode_s"] > 0]
        mine = speed_json.get(str(k), {})
        s = {"ttft_median_s": round(statistics.median(x["ttft_s"] for x in r), 4),
             "decode_tok_s_median": round(statistics.median(dec), 2) if dec else None,
             "prompt_tokens_median": statistics.median(x["prompt_tokens"] for x in r),
             "hf_prompt_tokens_median": statistics.median(p["hf_tokens"] for p in prompts if p["k"] == k)}
        if mine:
            s["softknn_memory_ttft_median_s"] = mine["memory"]["ttft_median_s"]
            s["ttft_ratio_softknn_over_llama_cpp"] = round(mine["memory"]["ttft_median_s"] / s["ttft_median_s"], 3)
            s["softknn_memory_decode_tok_s"] = mine["memory"]["decode_tok_s_median"]
        summ[str(k)] = s
    import importlib.metadata as md

    version = subprocess.run([args.python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    payload = {"command": COMMAND, "bundle": binfo, "llama_cpp_python": version, "gguf": gguf, "threads": 1,
               "questions": len(qs), "repeats": args.repeats, "max_tokens": 16,
               "timing": "wall inside the llama.cpp process: tokenised prompt → first token (cold KV cache: reset per "
                         "prompt), then the rest; softknn's figures from generation_speed.json (same questions, k, template)",
               "softknn_version": md.version("softknn"), "summary": summ, "wall_s": round(time.perf_counter() - t0, 1),
               "runs": rows}
    out = write("generation_llama_cpp", payload)
    print(out, json.dumps(summ, indent=1))
    return payload


def formula_bytes(tokens_per_chunk: float, layers: int, kind: str, nkv: int = 3, hs: int = 64) -> float:
    b = tokens_per_chunk * layers * 2 * nkv * hs * BYTES[kind]
    if kind == "int8":
        b += tokens_per_chunk * layers * 2 * nkv * 4  # one float32 scale per head vector
    return b


def memory(args) -> None:
    from softknn.generate.engine import GenParams

    enc, gen = models()
    kbp = ROOT / "softknn" / "sample_kb" / "kb"
    val = [q for q in load_qa() if q["split"] == "validation"]
    base = GenParams(max_tokens=32, temperature=0.0, k=4, mixing="joint")
    builds = {"fp16-all": ("all", "fp16"), "int8-all": ("all", "int8"), "fp16-last15": ("last15", "fp16"),
              "fp16-every3rd": ("every3rd", "fp16")}
    results, t0 = {}, time.perf_counter()
    tokens_per_chunk = None
    for name, (ls, kind) in builds.items():
        out = CACHE / "gen-sample" if name == "fp16-all" else CACHE / f"gen-mem-{name}"
        b, binfo = get_bundle(kbp, out, enc, gen, layers=LAYER_SETS[ls], memory=kind)
        rec = b.manifest.generator
        n_chunks = len(b.chunks)
        tokens_per_chunk = rec.tokens / n_chunks
        gdir = out / "generator"
        real = sum((gdir / f).stat().st_size for f in ("kv.npy", "kv_scale.npy") if (gdir / f).exists()) / n_chunks
        prev = RESULTS / "generation_answers.json"
        if name == "fp16-all" and prev.exists() and json.loads(prev.read_text()).get("subsample") is None:
            # the same bundle, greedy, the same parameters: the answers run's joint validation rows
            rows, binfo["validation_from"] = json.loads(prev.read_text())["per_question"]["validation"]["joint"], str(prev.name)
        else:
            rows = run_modes(gen_engine(enc, gen, b), val, {"joint": {}}, base)["joint"]
        results[name] = {"layers": len(rec.layers), "memory": kind, "bundle": binfo, "chunks": n_chunks, "tokens": rec.tokens,
                         "bytes_per_chunk_manifest": rec.bytes_per_chunk, "bytes_per_chunk_files": round(real, 1),
                         "bytes_per_chunk_formula": round(formula_bytes(tokens_per_chunk, len(rec.layers), kind), 1),
                         "validation": summarise(rows), "per_question": rows}
    table = {}
    for ls, spec in LAYER_SETS.items():
        nl = len(gen.layers(spec))
        for kind in BYTES:
            table[f"{ls}-{kind}"] = {"layers": nl, "memory": kind,
                                     "bytes_per_chunk": round(formula_bytes(tokens_per_chunk, nl, kind), 1),
                                     "bytes_per_token": formula_bytes(1, nl, kind)}
    payload = {"command": COMMAND, "formula": "tokens × layers × 2 (K,V) × 3 kv heads × 64 × bytes (+ tokens × layers × 2 × 3 × 4 B int8 scales)",
               "tokens_per_chunk_sample_kb": round(tokens_per_chunk, 2), "bytes_table": table, "builds": results,
               "wall_s": round(time.perf_counter() - t0, 1)}
    out = write("generation_memory", payload)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(table)
    axes[0].bar(names, [table[n]["bytes_per_chunk"] / 1024 for n in names])
    axes[0].set(ylabel="KiB per chunk (sample KB)", title="generator memory per chunk")
    axes[0].tick_params(axis="x", rotation=60)
    bn = list(results)
    axes[1].bar(bn, [results[n]["validation"]["accuracy"] for n in bn])
    for i, n in enumerate(bn):
        axes[1].text(i, results[n]["validation"]["accuracy"], f"{results[n]['validation']['accuracy']:.3f}", ha="center", va="bottom")
    axes[1].set(ylabel="validation accuracy (n=24, joint)", title="accuracy per build")
    fig.tight_layout()
    fig.savefig(RESULTS / "generation_memory.png", dpi=110)
    plt.close(fig)
    print(out, json.dumps({n: {k: v for k, v in r.items() if k != "per_question"} for n, r in results.items()}, indent=1))


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="part", required=True)
    a = sub.add_parser("answers", help="answer accuracy on the sample-KB QA set, per mode")
    a.add_argument("--limit", type=int, default=0, help="questions per split (0: all)")
    a.add_argument("--reordered-margin", type=float, default=0.05)
    a.add_argument("--name", default="")
    o = sub.add_parser("obliqa", help="gold-passage NLL per token on ObliQA, per mode")
    o.add_argument("--questions", type=int, default=100)
    o.add_argument("--passages", type=int, default=1000)
    o.add_argument("--alpha", type=float, default=None, help="default: generation_answers.json's alpha_chosen")
    s = sub.add_parser("speed", help="time to first token and decoding tokens/s vs prompt-stuffed RAG")
    s.add_argument("--questions", type=int, default=10)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--ks", default="4,8,16")
    s.add_argument("--llama-cpp-note", default=LLAMA_CPP_NOTE)
    ak = sub.add_parser("answers_k", help="k chosen on validation per method (prompt-stuffed, joint), then test")
    ak.add_argument("--ks", default="1,2,4")
    ak.add_argument("--limit", type=int, default=0, help="questions per split (0: all)")
    ap_ = sub.add_parser("answers_prior", help="softknn joint with the w_db prior: (k, β) chosen on validation, then test")
    ap_.add_argument("--ks", default="2,4")
    ap_.add_argument("--priors", default="0,1,2,4")
    ap_.add_argument("--limit", type=int, default=0, help="questions per split (0: all)")
    lc = sub.add_parser("llama_cpp", help="prompt-stuffed RAG in llama.cpp on the speed part's prompts")
    lc.add_argument("--python", required=True, help="the python of an environment with llama-cpp-python")
    lc.add_argument("--questions", type=int, default=10)
    lc.add_argument("--repeats", type=int, default=3)
    lc.add_argument("--ks", default="4,8,16")
    sub.add_parser("memory", help="bytes per chunk per layer set and representation, and the accuracy each keeps")


def run(args: argparse.Namespace) -> dict:
    global COMMAND
    COMMAND = getattr(args, "command", COMMAND)
    setup_threads()
    part = {"answers": answers, "answers_k": answers_k, "answers_prior": answers_prior, "llama_cpp": llama_cpp, "obliqa": obliqa, "speed": speed, "memory": memory}[args.part]
    out = part(args)
    return out if isinstance(out, dict) else json.loads((RESULTS / f"generation_{args.part}.json").read_text())


if __name__ == "__main__":  # python -m bench.generation PART: the same as python -m bench generation PART
    from bench.__main__ import main

    main(["generation", *sys.argv[1:]])
