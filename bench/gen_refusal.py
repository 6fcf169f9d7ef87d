"""Grounded refusal: how many out-of-KB questions generation refuses, and how many answerable ones.

    python -m bench gen_refusal [--passages 1000] [--dev-questions 300] [--rebuild]

The rule (softknn.generate.refusal) reads retrieval alone, so this measures it without a generator:
each KB is an encoder-only bundle (the default build: hybrid, its own λ calibration), its threshold
comes from `calibrate_refusal` on the bundle's chunks (the function the build runs in its generator
calibration), each question's s₁ from the Engine's retrieval as a /v1/generate request resolves it
(GenEngine.retrieve's InferParams: the bundle's default retrieval, the calibrated k), and the verdict
from `judge` (what GenEngine.stream calls before it decodes anything).

KBs:
- obliqa: ObliQA passages: the gold passages of bench/data/obliqa_qa.jsonl's 150 hand-written questions
  plus distractors from their documents up to --passages (gen_quality's `obliqa_qa_kb` selection), and
  the gold passages of --dev-questions seeded ObliQA dev questions (questions.json, all gold passages
  in the documents).
- sample: softknn/sample_kb/kb (the ferry FAQ and its handbook).

Questions: in-KB (answerable: their gold passages are in the KB) — obliqa_qa (150) and obliqa_dev
(--dev-questions) against obliqa; the sample QA set (qa.jsonl, 119) and the sample queries
(queries.jsonl, 60) against sample. Out-of-KB — Banking77 test (3,080) against obliqa; ObliQA dev
questions.json (2,788) and softknn/sample_kb/ood_queries.jsonl (20) against sample; also reported,
not targets: Banking77 against sample, the ood queries against obliqa. Targets: ≥ 80% of out-of-KB
refused, ≤ 5% of in-KB. Beside the build's quantile, the same rates at other quantiles of the
pseudo-questions (the sweep). Embeddings: the default encoder, one thread, cached under
/tmp/softknn-bench/refusal (bundles too).

→ bench/results/gen_refusal.json and .png.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, shared_data, write

ROOT = Path(__file__).resolve().parents[1]
NAME = "gen_refusal"
CACHE = Path("/tmp/softknn-bench/refusal")
SAMPLE = ROOT / "softknn" / "sample_kb"
QA_OBLIQA = ROOT / "bench" / "data" / "obliqa_qa.jsonl"
QUANTILES = (0.01, 0.02, 0.03, 0.05, 0.1)
TARGET_OUT, TARGET_IN = 0.80, 0.05
EXAMPLES = 5  # per question set: the in-KB questions refused / out-of-KB ones answered, nearest the threshold


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--passages", type=int, default=1000, help="the obliqa KB's hand-written-question part "
                   "(gold passages plus distractors from their documents), as gen_quality obliqa")
    p.add_argument("--dev-questions", type=int, default=300, help="ObliQA dev questions whose gold passages are "
                   "added to the obliqa KB (in-KB questions; a seeded sample)")
    p.add_argument("--rebuild", action="store_true", help="build the bundles again even when cached")


# --- the KBs and the questions --------------------------------------------------------------------------
def _obliqa_docs(data: Path) -> dict:
    docs: dict = {}
    for f in sorted((data / "obliqa_dev" / "documents").glob("*.json")):
        for p in json.loads(f.read_text(encoding="utf-8")):
            docs.setdefault(p["DocumentID"], []).append(p)
    return docs


def obliqa_kb(data: Path, hand: list[dict], n_passages: int, n_dev: int, seed: int = 0) -> tuple[Path, list[dict]]:
    """The obliqa KB's JSONL (module doc) and the dev questions whose gold passages it holds."""
    docs = _obliqa_docs(data)
    by_key = {(p["DocumentID"], p["PassageID"]): p for ps in docs.values() for p in ps}
    gold = {(g["DocumentID"], g["PassageID"]) for q in hand for g in q["gold"]}
    rows = [p for ps in docs.values() for p in ps if (p["DocumentID"], p["PassageID"]) in gold]
    pool = [p for d in sorted({d for d, _ in gold}) for p in docs[d]
            if (p["DocumentID"], p["PassageID"]) not in gold and 40 <= len(p["Passage"]) <= 4000]
    random.Random(seed).shuffle(pool)
    rows += pool[: max(0, n_passages - len(rows))]  # as bench/gen_quality.py obliqa_qa_kb
    have = {(p["DocumentID"], p["PassageID"]) for p in rows}
    qs = json.loads((data / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))
    usable = [q for q in qs if all((g["DocumentID"], g["PassageID"]) in by_key for g in q["Passages"])]
    dev = random.Random(seed).sample(usable, min(n_dev, len(usable)))
    for q in dev:
        for g in q["Passages"]:
            key = (g["DocumentID"], g["PassageID"])
            if key not in have:
                have.add(key)
                rows.append(by_key[key])
    out = CACHE / f"obliqa-{n_passages}-{n_dev}" / "kb.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"id": f"{p['DocumentID']}:{p['PassageID']}", "text": p["Passage"]}, ensure_ascii=False)
                   + "\n" for p in rows)
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")
    return out, [{"id": q["QuestionID"], "question": q["Question"]} for q in dev]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def question_sets(data: Path, hand: list[dict], dev: list[dict]) -> dict[str, list[str]]:
    with open(data / "banking77" / "test.csv", newline="", encoding="utf-8") as f:
        banking = [r["text"] for r in csv.DictReader(f)]
    all_dev = json.loads((data / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))
    return {"obliqa_qa": [q["question"] for q in hand], "obliqa_dev_in_kb": [q["question"] for q in dev],
            "obliqa_dev_all": [q["Question"] for q in all_dev], "banking77_test": banking,
            "sample_qa": [q["question"] for q in _jsonl(SAMPLE / "qa.jsonl")],
            "sample_queries": [q["text"] for q in _jsonl(SAMPLE / "queries.jsonl")],
            "sample_ood": [q["text"] for q in _jsonl(SAMPLE / "ood_queries.jsonl")]}


# which questions go against which KB, and what they are there
PLAN = {
    "obliqa": {"in_kb": ["obliqa_qa", "obliqa_dev_in_kb"], "out_of_kb": ["banking77_test"], "extra_out": ["sample_ood"]},
    "sample": {"in_kb": ["sample_qa", "sample_queries"], "out_of_kb": ["obliqa_dev_all", "obliqa_qa", "sample_ood"],
               "extra_out": ["banking77_test"]},
}


def bundle(kb: Path, out: Path, enc, rebuild: bool):
    """The encoder-only bundle of `kb` at `out` (the default build), built once; (bundle, build seconds)."""
    from softknn.common.errors import SoftKNNError
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.storage.bundle import load_bundle

    stamp = out / "built_from.txt"  # the input's sha256: a changed KB is built again
    digest = _digest(kb)
    if out.exists() and not rebuild and stamp.is_file() and stamp.read_text() == digest:
        try:
            return load_bundle(out / "bundle", expected_fingerprint=enc.info.fingerprint), None
        except SoftKNNError:
            pass
    t0 = time.perf_counter()
    build_bundle(kb, out / "bundle", BuildConfig(), enc, force=True, progress=False)
    stamp.write_text(digest)
    return load_bundle(out / "bundle", expected_fingerprint=enc.info.fingerprint), round(time.perf_counter() - t0, 1)


def _digest(kb: Path) -> str:
    h = hashlib.sha256()
    for f in sorted([kb] if kb.is_file() else [p for p in kb.rglob("*") if p.is_file()]):
        h.update(str(f.relative_to(kb.parent)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def embed_cached(enc, name: str, texts: list[str]) -> np.ndarray:
    """(n, D) float32 embeddings of texts as the service embeds an input, cached by model and texts."""
    from softknn.index_builder.pipeline import embed_texts

    key = hashlib.sha256((enc.info.fingerprint + "\0" + "\0".join(texts)).encode()).hexdigest()[:16]
    path = CACHE / f"q_{name}_{key}.npy"
    if path.exists():
        return np.load(path)
    emb = embed_texts(enc, texts, 64)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb


# --- measuring --------------------------------------------------------------------------------------------
def nearest(engine, xq: np.ndarray, texts: list[str]) -> np.ndarray:
    """s₁ (n,) of each question as a /v1/generate request without k, retrieval or filter retrieves
    (GenEngine.retrieve: the bundle's default retrieval at the fixed k; s₁ does not depend on k)."""
    from softknn.common.table import FIXED_K
    from softknn.infer.engine import InferParams

    ip = engine.resolve([InferParams(k=FIXED_K, evidence=0)])[0]
    out = []
    for s in range(0, len(texts), 256):
        retr = engine.retrieve(xq[s : s + 256], [ip] * len(texts[s : s + 256]), texts[s : s + 256])
        out += retr.nearest
    return np.asarray(out, dtype=np.float64)


def rates(s1: np.ndarray, record: dict) -> dict:
    """The verdicts of `judge` (the service's decision) on each s₁: the share refused."""
    from softknn.generate.refusal import judge

    refused = np.array([judge(float(v), record).refused for v in s1])
    return {"n": int(len(s1)), "refused": int(refused.sum()), "refused_rate": round(float(refused.mean()), 4)}


def _examples(texts: list[str], s1: np.ndarray, t: float, in_kb: bool) -> list[dict]:
    """The mistakes nearest the threshold: in-KB questions refused, out-of-KB ones answered."""
    wrong = np.flatnonzero(s1 < t) if in_kb else np.flatnonzero(s1 >= t)
    order = wrong[np.argsort(-s1[wrong])] if in_kb else wrong[np.argsort(s1[wrong])]
    return [{"question": texts[i], "s1": round(float(s1[i]), 4)} for i in order[:EXAMPLES]]


def measure_kb(name: str, b, enc, questions: dict[str, list[str]]) -> dict:
    from softknn.generate.refusal import REFUSAL_QUANTILE, calibrate_refusal, pseudo_nearest, refusal_threshold
    from softknn.index_builder.pipeline import embed_texts
    from softknn.infer.engine import Engine

    texts = [c["text"] for c in b.chunks]
    xb = np.load(Path(b.path) / "embeddings.npy")
    t0 = time.perf_counter()
    outcomes = pseudo_nearest(xb, texts, lambda t: embed_texts(enc, t))
    record = calibrate_refusal(xb, texts, None, outcomes=outcomes)  # type: ignore[arg-type]  # outcomes given
    cal_s = round(time.perf_counter() - t0, 1)
    pseudo = outcomes[0].astype(np.float64)
    engine = Engine(enc, b)
    plan = PLAN[name]
    sets: dict = {}
    s1s: dict[str, np.ndarray] = {}
    for role in ("in_kb", "out_of_kb", "extra_out"):
        for qs in plan[role]:
            t1 = time.perf_counter()
            s1 = nearest(engine, embed_cached(enc, qs, questions[qs]), questions[qs])
            s1s[qs] = s1
            sets[qs] = {"role": role, **rates(s1, record),
                        "s1_quantiles": {f"{x:g}": round(float(np.quantile(s1, x)), 4) for x in (0.02, 0.05, 0.5, 0.95)},
                        "examples_wrong": _examples(questions[qs], s1, record["threshold"], role == "in_kb"),
                        "seconds": round(time.perf_counter() - t1, 1)}
            print(name, qs, {k: v for k, v in sets[qs].items() if k not in ("examples_wrong", "s1_quantiles")},
                  flush=True)
    sweep = []
    for q in QUANTILES:
        t = refusal_threshold(pseudo, q)
        rec = {**record, "threshold": t}
        sweep.append({"quantile": q, "threshold": round(t, 4), "chosen": q == REFUSAL_QUANTILE,
                      **{qs: rates(s1, rec)["refused_rate"] for qs, s1 in s1s.items()}})
    summary = {"in_kb_refused": _pooled(sets, plan["in_kb"]), "out_of_kb_refused": _pooled(sets, plan["out_of_kb"])}
    summary["meets_targets"] = bool(summary["in_kb_refused"] <= TARGET_IN and summary["out_of_kb_refused"] >= TARGET_OUT
                                    and all(sets[q]["refused_rate"] <= TARGET_IN for q in plan["in_kb"])
                                    and all(sets[q]["refused_rate"] >= TARGET_OUT for q in plan["out_of_kb"]))
    return {"chunks": len(b), "refusal_record": record, "calibration_s": cal_s, "summary": summary, "sets": sets,
            "sweep": sweep, "_s1": s1s, "_pseudo": pseudo}


def _pooled(sets: dict, names: list[str]) -> float:
    n = sum(sets[q]["n"] for q in names)
    return round(sum(sets[q]["refused"] for q in names) / n, 4) if n else 0.0


def run(args: argparse.Namespace) -> dict:
    from bench.generation import setup_threads
    from softknn.model.encoder import Encoder

    setup_threads()
    t0 = time.perf_counter()
    data = shared_data()
    hand = _jsonl(QA_OBLIQA)
    kb, dev = obliqa_kb(data, hand, args.passages, args.dev_questions)
    questions = question_sets(data, hand, dev)
    enc = Encoder()
    kbs, built = {}, {}
    kbs["obliqa"], built["obliqa"] = bundle(kb, CACHE / f"obliqa-{args.passages}-{args.dev_questions}", enc, args.rebuild)
    kbs["sample"], built["sample"] = bundle(SAMPLE / "kb", CACHE / "sample", enc, args.rebuild)
    results = {name: measure_kb(name, b, enc, questions) for name, b in kbs.items()}
    _plot(results)
    for r in results.values():
        r.pop("_s1"), r.pop("_pseudo")
    payload = {"command": getattr(args, "command", ""),
               "rule": "refuse when s1 (the nearest chunk's dense similarity) < the bundle's threshold "
                       "(softknn.generate.refusal)",
               "targets": {"out_of_kb_refused_at_least": TARGET_OUT, "in_kb_refused_at_most": TARGET_IN},
               "kbs": {name: {**r, "build_s": built[name]} for name, r in results.items()},
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "wall_s": round(time.perf_counter() - t0, 1)}
    return write(NAME, payload)


def _plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2))
    for ax, (name, r) in zip(np.atleast_1d(axes), results.items(), strict=True):
        bins = np.linspace(0, 1, 51)
        ax.hist(r["_pseudo"], bins=bins, density=True, histtype="step", lw=1.5, color="grey", ls="--",
                label=f"held-out sentences (calibration, n={len(r['_pseudo'])})")
        for qs, s1 in r["_s1"].items():
            st = r["sets"][qs]
            style = {"in_kb": "-", "out_of_kb": "-", "extra_out": ":"}[st["role"]]
            ax.hist(s1, bins=bins, density=True, histtype="step", lw=1.3, ls=style,
                    label=f"{qs} ({st['role']}, n={st['n']}): {st['refused_rate']:.1%} refused")
        t = r["refusal_record"]["threshold"]
        ax.axvline(t, color="black", lw=1)
        ax.set(title=f"{name} KB ({r['chunks']} chunks): threshold {t:.3f}", xlabel="s1, nearest chunk's dense similarity",
               ylabel="density")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from bench.__main__ import main

    main([NAME, *sys.argv[1:]])
