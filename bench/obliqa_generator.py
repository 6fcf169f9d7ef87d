"""The whole ObliQA corpus as one bundle with stored generator memory: build cost, bytes, and time to first token
with the chunk cache cold and warm.

- `build`: every passage of ../shared/data/obliqa_dev/documents (13,732; 5.3M characters) as a JSONL KB, built by
  the CLI as a user would (`softknn build KB -o OUT --generator smollm2-135m-instruct --generator-memory q4`: the smallest memory
  `python -m bench gen_quality memory` found within 2 points of fp16's answers), timed; records the
  wall seconds, peak RSS, bundle bytes (all, and the generator memory's), the manifest's bytes per token and the
  generation defaults the build calibrated.
- `serve`: the built bundle in a GenEngine (the service's decode loop, one thread): questions from
  bench/data/obliqa_qa.jsonl answered twice each, the first with the chunk cache empty (R's K/V read from the
  memory-mapped store and dequantised), the second with R's chunks in the in-RAM LRU; time to first token and
  the answers.

    python -m bench obliqa_generator build [--memory q4] [--keep 1] [--limit 0]
    python -m bench obliqa_generator serve [--questions 20]

→ bench/results/obliqa_generator_<part>.json (+ .png for serve).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, write

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT.parent / "shared" / "data" / "obliqa_dev" / "documents"
OUT = Path("/tmp/softknn-bench/obliqa-full")


def kb_file(limit: int = 0) -> tuple[Path, int, int]:
    """The corpus as JSONL (id = the passage's ID; DocumentID:PassageID is not unique): path, passages, characters."""
    recs = []
    for p in sorted(DOCS.glob("*.json"), key=lambda p: int(p.stem)):
        recs += [{"id": r["ID"], "text": r["Passage"]}
                 for r in json.loads(p.read_text()) if r["Passage"].strip()]
    recs = recs[: limit or None]
    path = OUT.parent / f"obliqa-full-{limit or 'all'}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return path, len(recs), sum(len(r["text"]) for r in recs)


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(args) -> dict:
    kb, n, chars = kb_file(args.limit)
    cmd = [sys.executable, "-m", "softknn", "build", str(kb), "-o", str(OUT), "--force",
           "--generator", "smollm2-135m-instruct", "--generator-memory", args.memory, "--generator-keep", str(args.keep)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    m = json.loads((OUT / "manifest.json").read_text())
    g = m["generator"]
    gen_files = [f for f in OUT.rglob("*") if f.is_file() and "gen" in f.name]
    payload = {"command": getattr(args, "command", ""), "cli": " ".join(cmd[1:]), "passages": n, "characters": chars,
               "chunks": m.get("num_chunks") or m.get("counts"), "build_s": round(wall, 1),
               "peak_rss_gb": round(peak_kb / 2**20, 2), "bundle_bytes": _du(OUT),
               "generator_bytes": sum(f.stat().st_size for f in gen_files),
               "generator": {k: g.get(k) for k in ("memory", "keep", "layers", "bytes_per_token",
                                                   "bytes_per_token_formula", "bytes_per_chunk", "tokens")},
               "calibration": g.get("calibration"), "path": str(OUT)}
    print({k: v for k, v in payload.items() if k != "calibration"}, flush=True)
    return write("obliqa_generator_build", payload)


def serve(args) -> dict:
    from dataclasses import replace

    from bench.gen_quality import _correct
    from bench.generation import gen_engine, models, msgs, setup_threads
    from softknn.generate.engine import GenParams
    from softknn.generate.model import Step
    from softknn.storage.bundle import load_bundle

    setup_threads()
    enc, gen = models()
    b = load_bundle(OUT, expected_fingerprint=enc.info.fingerprint)
    ge = gen_engine(enc, gen, b)
    qs = [json.loads(x) for x in (ROOT / "bench" / "data" / "obliqa_qa.jsonl").read_text().splitlines() if x.strip()]
    qs = [q for q in qs if q["split"] == "test"][: args.questions]
    base = GenParams(max_tokens=24, temperature=0.0)
    ge.answer(base, messages=msgs("What is a warm-up question?"))  # the decode loop's sessions opened
    rows = []
    for q in qs:
        ge.store.clear()
        row = {"id": q["id"]}
        for tag in ("cold", "warm"):
            t0 = time.perf_counter()
            first = None
            text = ""
            for ev in ge.stream(replace(base), messages=msgs(q["question"])):
                if isinstance(ev, Step):
                    if first is None:
                        first = time.perf_counter() - t0
                    text += ev.text
            row[tag] = {"ttft_s": round(first or float("nan"), 4), "total_s": round(time.perf_counter() - t0, 3),
                        "answer": text.strip()}
        row["correct"] = _correct(row["warm"]["answer"], q)
        rows.append(row)
        print(row, flush=True)
    summ = {tag: {"ttft_p50_s": round(statistics.median(r[tag]["ttft_s"] for r in rows), 4),
                  "ttft_mean_s": round(statistics.mean(r[tag]["ttft_s"] for r in rows), 4)} for tag in ("cold", "warm")}
    summ["accuracy"] = round(sum(r["correct"] for r in rows) / max(len(rows), 1), 4)
    payload = {"command": getattr(args, "command", ""), "bundle": str(OUT), "questions": len(rows),
               "params": "calibrated defaults, greedy, 24 tokens, one thread", "summary": summ, "per_question": rows}
    res = write("obliqa_generator_serve", payload)
    _plot(rows)
    return res


def _plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot([[r["cold"]["ttft_s"] for r in rows], [r["warm"]["ttft_s"] for r in rows]], tick_labels=["cold", "warm"])
    ax.set(ylabel="time to first token (s)", title="ObliQA full corpus, q4 memory: chunk cache cold vs warm")
    fig.tight_layout()
    fig.savefig(RESULTS / "obliqa_generator_serve.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="part", required=True)
    b = sub.add_parser("build", help="build the whole corpus with stored generator memory (timed)")
    b.add_argument("--memory", default="q4")
    b.add_argument("--keep", type=float, default=1.0)
    b.add_argument("--limit", type=int, default=0)
    s = sub.add_parser("serve", help="time to first token with the chunk cache cold and warm")
    s.add_argument("--questions", type=int, default=20)


def run(args: argparse.Namespace) -> dict:
    return {"build": build, "serve": serve}[args.part](args)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["obliqa_generator", *sys.argv[1:]])
