"""Question words as BM25 terms or not: top-1 retrieval, dense vs hybrid vs lexical, analyser "en"
(bm25s's stopwords) against "en+questions" (those and softknn.retrieval.lexical.QUESTION_WORDS), on three KBs.

    python -m bench question_words [--banking-per-intent 10] [--banking-queries 4] [--obliqa-docs 4]

- pydoc: the 79 Python documentation topics that ship with Python (pydoc_data.topics), chunked as
  `softknn build` chunks them, and the 10 QUESTIONS below, whose right topics were fixed before the
  first run. Right: the top-1 chunk comes from one of them.
- banking77: KB = the first --banking-per-intent train utterances of each intent, queries = the first
  --banking-queries test utterances of each. Right: the top-1 utterance's intent is the query's.
- obliqa: KB = every passage of the first --obliqa-docs documents of ../shared/data/obliqa_dev,
  queries = the questions whose gold passages all lie in them. Right: the top-1 passage is a gold one.

Dense is e_q·e_c of the plain model (as the service retrieves); BM25 is softknn.retrieval.lexical's index over
the same texts with each analyser; hybrid and lexical are softknn.retrieval.scoring.scores_reference with the
service's defaults (λ = LEXICAL_WEIGHT, the unlabelled KB's, and its CANDIDATES normalisation pool).
Dense does not depend on the analyser: it is the same figure in both columns.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.common import write

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
NAME = "question_words"
SPECS = ("en", "en+questions")
MODES = ("dense", "hybrid", "lexical")

# (question, its right topics): written before the first run and not changed after it
QUESTIONS = [
    ("what does the with statement do", {"with", "context-managers"}),
    ("difference between is and ==", {"comparisons"}),
    ("how do I raise an exception", {"raise", "exceptions"}),
    ("what does the yield keyword do", {"yield"}),
    ("how does a for loop work", {"for"}),
    ("what is a lambda expression", {"lambda"}),
    ("how do I format a string with f-strings", {"formatstrings"}),
    ("what does nonlocal do", {"nonlocal"}),
    ("how do I slice a list", {"slicings", "typesseq"}),
    ("what does the global statement do", {"global"}),
]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--banking-per-intent", type=int, default=10, help="train utterances per intent in the KB")
    p.add_argument("--banking-queries", type=int, default=4, help="test utterances per intent as queries")
    p.add_argument("--obliqa-docs", type=int, default=4, help="ObliQA documents whose passages form the KB")


def _embed(enc, texts: list[str], batch_size: int = 32) -> np.ndarray:
    out = np.zeros((len(texts), enc.info.dim), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        batch = enc.tokenize([texts[i] for i in rows], truncate=True)
        out[rows] = enc.forward_plain(batch).embedding.float().cpu().numpy()
    return out


def pydoc_corpus(enc) -> tuple[list[str], list[str], list[str], list[set[str]]]:
    from pydoc_data.topics import topics

    from softknn.index_builder.chunker import chunk_documents
    from softknn.index_builder.reader import Document

    docs = [Document(name, text) for name, text in sorted(topics.items()) if text.strip()]
    chunks = chunk_documents(docs, enc.tokenizer, enc.max_seq_length - 8, 32)  # `softknn build`'s defaults
    return [c.text for c in chunks], [c.doc_id for c in chunks], [q for q, _ in QUESTIONS], [t for _, t in QUESTIONS]


def banking_corpus(per_intent: int, queries: int):
    def rows(name: str, n: int) -> list[tuple[str, str]]:
        seen: dict[str, int] = defaultdict(int)
        out = []
        with open(DATA / "banking77" / name, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                if seen[r["category"]] < n:
                    seen[r["category"]] += 1
                    out.append((r["text"], r["category"]))
        return out

    kb, qs = rows("train.csv", per_intent), rows("test.csv", queries)
    return [t for t, _ in kb], [c for _, c in kb], [t for t, _ in qs], [{c} for _, c in qs]


def obliqa_corpus(n_docs: int):
    files = sorted(glob.glob(str(DATA / "obliqa_dev" / "documents" / "*.json")), key=lambda p: int(Path(p).stem))
    passages = [p for f in files[:n_docs] for p in json.loads(Path(f).read_text(encoding="utf-8")) if p["Passage"].strip()]
    keys = [f"{p['DocumentID']}:{p['PassageID']}" for p in passages]
    have = set(keys)
    texts, gold = [], []
    for q in json.loads((DATA / "obliqa_dev" / "questions.json").read_text(encoding="utf-8")):
        g = {f"{p['DocumentID']}:{p['PassageID']}" for p in q["Passages"]}
        if g and g <= have:
            texts.append(q["Question"])
            gold.append(g)
    return [p["Passage"] for p in passages], keys, texts, gold


def top1(kb_texts, kb_keys, q_texts, q_right, kb_emb, q_emb) -> dict:
    from softknn.retrieval.lexical import LexicalIndex, LexicalSpec
    from softknn.retrieval.scoring import CANDIDATES, LEXICAL_WEIGHT, scores_reference

    dense = q_emb @ kb_emb.T
    out: dict = {}
    for name in SPECS:
        idx = LexicalIndex.build(kb_texts, LexicalSpec(stopwords=name))
        right = dict.fromkeys(MODES, 0)
        examples = []
        for i, (q, want) in enumerate(zip(q_texts, q_right, strict=True)):
            terms = idx.analyzer.terms(q)
            b = idx.scores(terms)
            for mode in MODES:
                s = scores_reference(dense[i], b, mode, LEXICAL_WEIGHT, CANDIDATES)
                c = int(np.lexsort((np.arange(len(s)), -s))[0])
                right[mode] += kb_keys[c] in want
                if mode == "hybrid" and i < 10:
                    examples.append({"query": q, "terms": terms, "top1": kb_keys[c], "right": kb_keys[c] in want})
        out[name] = {"top1_right": right, "accuracy": {m: round(right[m] / len(q_texts), 4) for m in MODES},
                     "vocabulary": len(idx.vocab), "hybrid_examples": examples}
    return out


def run(args: argparse.Namespace) -> dict:
    from softknn.model.encoder import Encoder
    from softknn.params import Settings

    enc = Encoder(Settings().model.name, device="cpu")
    corpora = {"pydoc": pydoc_corpus(enc), "banking77": banking_corpus(args.banking_per_intent, args.banking_queries),
               "obliqa": obliqa_corpus(args.obliqa_docs)}
    results = {}
    for name, (kb_texts, kb_keys, q_texts, q_right) in corpora.items():
        t0 = time.perf_counter()
        kb_emb, q_emb = _embed(enc, kb_texts), _embed(enc, q_texts)
        results[name] = {"chunks": len(kb_texts), "queries": len(q_texts), **top1(kb_texts, kb_keys, q_texts, q_right, kb_emb, q_emb),
                         "seconds": round(time.perf_counter() - t0, 1)}
        a = results[name]
        print(f"{name}: {a['chunks']} chunks, {a['queries']} queries; top-1 right "
              + "; ".join(f"{s}: " + ", ".join(f"{m} {a[s]['top1_right'][m]}" for m in MODES) for s in SPECS), flush=True)
        payload = write(NAME, {"args": vars(args), "results": results})  # after each KB: a cut-off run keeps what it did
    _plot(results)
    return payload


def _plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2))
    for ax, (name, r) in zip(np.atleast_1d(axes), results.items(), strict=True):
        x = np.arange(len(MODES))
        for j, s in enumerate(SPECS):
            ax.bar(x + (j - 0.5) * 0.38, [r[s]["accuracy"][m] for m in MODES], 0.38, label=s)
        ax.set_xticks(x, MODES)
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} ({r['queries']} queries)")
    np.atleast_1d(axes)[0].set_ylabel("top-1 right")
    np.atleast_1d(axes)[0].legend(title="stopwords", fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=110)
    plt.close(fig)
