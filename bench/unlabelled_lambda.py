"""An unlabelled KB's λ: the fixed 0.6 against the one it chooses at build time from its own chunks.

    python -m bench unlabelled_lambda [--banking-per-intent 10] [--banking-queries 4] [--obliqa-docs 4]

Three KBs, the corpora of bench/question_words.py (its loaders), each searched by dense, lexical,
hybrid at the old fixed λ 0.6 and hybrid at the λ softknn.retrieval.calibration.calibrate_unlabelled chooses
for that KB (held-out sentences of its own chunks; no query or label is used), with each
analyser's stopwords ("en", "en+questions"):

- pydoc: the 79 Python documentation topics (pydoc_data.topics), the 10 questions of question_words;
- banking77: the first --banking-per-intent train utterances of each intent, the first
  --banking-queries test utterances of each as queries; right: the top-1 utterance's intent;
- obliqa: the passages of the first --obliqa-docs documents and the questions whose gold passages
  lie in them, of the held-out (test) split only: bench/obliqa_prepare's seeded split (seed 0, 500
  validation questions, where λ 0.6 was chosen) is replayed and its validation questions left out.

Per cell: top-1 right and MRR@10 (the first right chunk's rank), and for each mode its paired
difference to dense with the standard error of that difference (noise: a loss within 2 SE); and
the real queries' MRR@10 at every λ of the calibration's grid, beside the pseudo-queries' (in
`pseudo_queries.grid`), to show how well the one stands in for the other.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from bench.common import write
from bench.question_words import DATA, SPECS, _embed, banking_corpus, obliqa_corpus, pydoc_corpus

NAME = "unlabelled_lambda"
MODES = ("dense", "lexical", "hybrid_0.6", "hybrid_self")


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--banking-per-intent", type=int, default=10, help="train utterances per intent in the KB")
    p.add_argument("--banking-queries", type=int, default=4, help="test utterances per intent as queries")
    p.add_argument("--obliqa-docs", type=int, default=4, help="ObliQA documents whose passages form the KB")
    p.add_argument("--name", default=NAME, help="results file name (bench/results/NAME.json|png)")


def obliqa_heldout(n_docs: int):
    """question_words.obliqa_corpus without obliqa_prepare's validation questions."""
    questions = json.loads((DATA / "obliqa_dev" / "questions.json").read_text(encoding="utf-8"))
    val = {questions[i]["Question"] for i in random.Random(0).sample(range(len(questions)), 500)}
    kb_texts, kb_keys, q_texts, q_right = obliqa_corpus(n_docs)
    keep = [i for i, q in enumerate(q_texts) if q not in val]
    return kb_texts, kb_keys, [q_texts[i] for i in keep], [q_right[i] for i in keep], len(q_texts) - len(keep)


def _rank_scores(s: np.ndarray, keys: list[str], want: set[str]) -> tuple[bool, float]:
    order = np.lexsort((np.arange(len(s)), -s))[:10]
    hits = [r for r, c in enumerate(order.tolist()) if keys[c] in want]
    return bool(hits and hits[0] == 0), 1.0 / (hits[0] + 1) if hits else 0.0


def vs_dense(x: dict, m: str) -> dict:
    """Mode m's mean paired difference to dense over the queries, and its standard error."""
    diff = np.asarray(x[m], dtype=np.float64) - np.asarray(x["dense"], dtype=np.float64)
    n = len(diff)
    return {"diff": round(float(diff.mean()), 4), "se": round(float(diff.std(ddof=1) / np.sqrt(n)), 4) if n > 1 else None}


def measure(kb_texts, kb_keys, q_texts, q_right, kb_emb, q_emb, enc) -> dict:
    from softknn.retrieval.calibration import PSEUDO_WEIGHTS, calibrate_unlabelled
    from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
    from softknn.retrieval.scoring import CANDIDATES, LEXICAL_WEIGHT, scores_reference

    dense = q_emb @ kb_emb.T
    out: dict = {}
    for name in SPECS:
        spec = LexicalSpec(stopwords=name)
        t0 = time.perf_counter()
        cal = calibrate_unlabelled(kb_emb, kb_texts, spec, lambda t: _embed(enc, t), candidates=CANDIDATES)
        cal_s = time.perf_counter() - t0
        lam = cal["retrieval_defaults"].get("hybrid", {}).get("lexical_weight", LEXICAL_WEIGHT)
        idx = LexicalIndex.build(kb_texts, spec)
        top1 = {m: [] for m in MODES}
        rr = {m: [] for m in MODES}
        sweep = {w: 0.0 for w in PSEUDO_WEIGHTS}  # MRR@10 of the real queries at every grid λ
        for i, (q, want) in enumerate(zip(q_texts, q_right, strict=True)):
            b = idx.scores(idx.analyzer.terms(q))
            for w in PSEUDO_WEIGHTS:
                sweep[w] += _rank_scores(scores_reference(dense[i], b, "hybrid", w, CANDIDATES), kb_keys, want)[1] / len(q_texts)
            for mode, (kind, w) in {"dense": ("dense", 0.0), "lexical": ("lexical", 0.0),
                                    "hybrid_0.6": ("hybrid", LEXICAL_WEIGHT), "hybrid_self": ("hybrid", lam)}.items():
                ok, r = _rank_scores(scores_reference(dense[i], b, kind, w, CANDIDATES), kb_keys, want)
                top1[mode].append(ok)
                rr[mode].append(r)
        out[name] = {"lexical_weight_self": lam, "calibration_seconds": round(cal_s, 1),
                     "pseudo_queries": cal.get("pseudo_queries"),
                     "top1_right": {m: int(sum(top1[m])) for m in MODES},
                     "top1": {m: round(float(np.mean(top1[m])), 4) for m in MODES},
                     "mrr10": {m: round(float(np.mean(rr[m])), 4) for m in MODES},
                     "top1_vs_dense": {m: vs_dense(top1, m) for m in MODES[1:]},
                     "mrr10_vs_dense": {m: vs_dense(rr, m) for m in MODES[1:]},
                     "queries_mrr10_by_lexical_weight": {f"{w:g}": round(v, 4) for w, v in sweep.items()}}
    return out


def run(args: argparse.Namespace) -> dict:
    from softknn.model.encoder import Encoder
    from softknn.params import Settings

    enc = Encoder(Settings().model.name, device="cpu")
    ob = obliqa_heldout(args.obliqa_docs)
    corpora = {"pydoc": pydoc_corpus(enc), "banking77": banking_corpus(args.banking_per_intent, args.banking_queries),
               "obliqa": ob[:4]}
    results: dict = {}
    payload: dict = {}
    for name, (kb_texts, kb_keys, q_texts, q_right) in corpora.items():
        t0 = time.perf_counter()
        kb_emb, q_emb = _embed(enc, kb_texts), _embed(enc, q_texts)
        results[name] = {"chunks": len(kb_texts), "queries": len(q_texts),
                         **({"validation_questions_left_out": ob[4]} if name == "obliqa" else {}),
                         **measure(kb_texts, kb_keys, q_texts, q_right, kb_emb, q_emb, enc),
                         "seconds": round(time.perf_counter() - t0, 1)}
        a = results[name]
        print(f"{name}: {a['chunks']} chunks, {a['queries']} queries; "
              + "; ".join(f"{s} (λ self {a[s]['lexical_weight_self']}): top-1 "
                          + ", ".join(f"{m} {a[s]['top1_right'][m]}" for m in MODES)
                          + " | MRR@10 " + ", ".join(f"{m} {a[s]['mrr10'][m]}" for m in MODES) for s in SPECS), flush=True)
        payload = write(args.name, {"args": vars(args), "results": results})  # after each KB: a cut-off run keeps what it did
    _plot(results, args.name)
    return payload


def _plot(results: dict, name: str = NAME) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS

    fig, axes = plt.subplots(1, len(results), figsize=(4.4 * len(results), 3.4))
    for ax, (kb, r) in zip(np.atleast_1d(axes), results.items(), strict=True):
        x = np.arange(len(MODES))
        for j, s in enumerate(SPECS):
            ax.bar(x + (j - 0.5) * 0.38, [r[s]["top1"][m] for m in MODES], 0.38,
                   label=f"{s} (self λ {r[s]['lexical_weight_self']})")
        ax.set_xticks(x, MODES, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(f"{kb} ({r['queries']} queries)")
        ax.legend(title="stopwords", fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("top-1 right")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)
