"""Choose softknn's evidence defaults on ObliQA dev, on the validation questions only.

    python -m bench obliqa_prepare          # kb.jsonl, questions_{val,test}.jsonl
    softknn build artifacts/eval/obliqa/kb.jsonl --out artifacts/eval/bundles/obliqa --id-field ID \
        --text-field Passage --memory kv --kv-dtype float16
    python -m bench sweep_obliqa [--limit N] [--out artifacts/eval/obliqa/sweeps]

The 500 questions of questions_val.jsonl (a seeded split; the 2,288 others are the reported test
set) are run through the engine for each variant, and the evidence ranking (by memory-mass share,
deduplicated by passage id) is scored with recall@k / nDCG@10 / MRR@10 beside the plain ranking
by e_q·e_c over the same k chunks. In fixed mixing round one the mass share is (1−α)·w_db, which
orders R exactly as the baseline; what can differ: joint mixing (shares set by the layer's own
attention), and a second retrieval round with the fused embedding (requery "fused" e', or "sum"
normalise(e_q + e')), where α, τ and k shape e'. Post hoc, joint mode's shares are also tried as a
re-ranking feature beside s, with a passage-length prior as the control. Writes sweeps.json and
sweep_obliqa.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from softknn.evaluation.metrics import retrieval_metrics
from softknn.evaluation.run import Strategy, baseline_outcomes, ranked_ids, read_queries, run_variants, sample
from softknn.index_builder.reader import Fields
from softknn.infer.engine import Engine, InferParams
from softknn.model.encoder import Encoder
from softknn.storage.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "artifacts" / "eval" / "bundles" / "obliqa"
VAL = ROOT / "artifacts" / "eval" / "obliqa" / "questions_val.jsonl"


def variants() -> list[tuple[str, InferParams, Strategy]]:
    base = dict(alpha=0.7, mixing="fixed", k=10, temperature=0.05)
    return [("round 1, fixed (= baseline order)", InferParams(**base), Strategy()),
            ("round 1, joint", InferParams(**{**base, "mixing": "joint"}), Strategy()),
            ("round 2 fused, α=0.7", InferParams(**base), Strategy(2, "fused")),
            ("round 2 sum, α=0.5", InferParams(**{**base, "alpha": 0.5}), Strategy(2, "sum")),
            ("round 2 sum, α=0.9", InferParams(**{**base, "alpha": 0.9}), Strategy(2, "sum"))]


def reranks(outs: list[dict], gold: list[list[str]], count) -> list[dict]:
    """Joint-mode evidence re-ranked by s + λ·log(mass share), and, as a control, by s + λ·log(n_c)
    (n_c = the chunk's token count): does the attention add anything beyond a length prior?"""
    def rank(fn) -> dict:
        ranked = [ranked_ids([(c, d) for c, d, *_ in sorted(o["items"], key=lambda it: -fn(it))], "doc") for o in outs]
        return retrieval_metrics(ranked, gold)

    rows = []
    for lam in (0.005, 0.01, 0.02, 0.05):
        rows.append({"variant": f"joint, s + {lam}·log(mass)", "softknn": rank(lambda it: it[2] + lam * math.log(it[3] + 1e-30))})  # noqa: B023 (rank calls it now)
        rows.append({"variant": f"control, s + {lam}·log(n_tokens)", "softknn": rank(lambda it: it[2] + lam * math.log(count(it[0])))})  # noqa: B023
    return rows


def plot(rows: list[dict], base: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, metric in zip(axes, ("ndcg@10", "recall@10"), strict=True):
        names = [r["variant"] for r in rows]
        ax.barh(range(len(rows)), [r["softknn"][metric] for r in rows], color="tab:blue")
        ax.axvline(base[metric], color="k", ls="--", lw=1)
        ax.set_title(f"softknn variants (bars) vs plain retrieval, k=10 (dashed: {base[metric]:.3f})", fontsize=9)
        ax.set_yticks(range(len(rows)), names, fontsize=8)
        lo = min(min(r["softknn"][metric] for r in rows), base[metric])
        ax.set_xlim(lo - 0.03, max(max(r["softknn"][metric] for r in rows), base[metric]) + 0.01)
        ax.set_xlabel(f"{metric} (ObliQA validation questions)")
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / "sweep_obliqa.png", dpi=110)
    plt.close(fig)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--limit", type=int, default=None, help="a seeded subset of the validation questions")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "eval" / "obliqa" / "sweeps")


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    encoder = Encoder()
    bundle = load_bundle(BUNDLE, expected_fingerprint=encoder.info.fingerprint)
    qs = sample(read_queries(VAL, Fields("id", "text", None), "gold_ids"), args.limit)
    vs = variants()
    t0 = time.time()
    ran = run_variants(Engine(encoder, bundle), qs, [(p, s) for _, p, s in vs], batch_size=16, desc="obliqa val")
    gold = [q.gold for q in qs]
    rows = [{"variant": name, "params": {"alpha": p.alpha, "mixing": p.mixing, "k": p.k, "temperature": p.temperature,
                                         "rounds": s.rounds, "requery": s.requery},
             "softknn": retrieval_metrics([o["ranked"] for o in outs], gold)}
            for (name, p, s), outs in zip(vs, ran.outcomes, strict=True)]
    rows_of = {c["chunk_id"]: i for i, c in enumerate(bundle.chunks)}
    joint = next(i for i, (_, p, s) in enumerate(vs) if p.mixing == "joint" and s.rounds == 1)
    post = reranks(ran.outcomes[joint], gold, lambda cid: int(bundle.kv.count[rows_of[cid]]))
    base = {k: retrieval_metrics([o["ranked"] for o in baseline_outcomes(ran, bundle.chunks, k, 0.05)], gold)
            for k in (10, 20)}
    result = {"n": len(qs), "seconds": round(time.time() - t0), "baseline": base, "variants": rows, "post_hoc": post}
    (args.out / "sweeps.json").write_text(json.dumps(result, indent=1))
    plot(rows + post, base[10], args.out)
    for r in rows + post:
        print(f"{r['variant']:36s} " + "  ".join(f"{k} {v:.4f}" for k, v in r["softknn"].items() if k != "n"))
    print(f"{'plain retrieval k=10':36s} " + "  ".join(f"{k} {v:.4f}" for k, v in base[10].items() if k != "n"))
    return result


if __name__ == "__main__":  # python -m bench sweep_obliqa: the same as python -m bench sweep_obliqa
    import sys

    from bench.__main__ import main

    main(["sweep_obliqa", *sys.argv[1:]])
