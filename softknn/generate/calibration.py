"""Generation defaults chosen per KB at build time, from the KB itself: k (how many chunks the
generator attends to) and β (the k-NN prior's weight in the joint softmax, softknn.generate.attention).

Like the unlabelled λ (softknn.retrieval.calibration), the KB makes its own questions. A fill-in-the-blank
pseudo-question is a sentence of a chunk with a number, date or name replaced by a blank; the chunk
without that sentence (re-embedded, re-indexed for BM25) is what retrieval must find, so the question's
words are not a verbatim key to it; the generator then attends to the retrieved chunks' stored
memory (the whole chunks) and must write the removed span. Each question is answered greedily with
every (k, β) of the grid on the same ranking; a setting scores 1 when the answer holds the span
(`answer_contains`). k is the smallest whose accuracy, at some β, is within SE_WIDTH standard errors
(of the paired difference) of the best setting's: more chunks cost time and distract a small model, and
pseudo-questions are not users' questions, so a larger k must win clearly on them to be chosen. β costs
nothing, so no margin is asked of it (asking one left β = 0 at every k on every KB measured, where the
validation splits wanted the prior at k ≥ 2: docs/generation.md, "Several chunks"): β is the one with
the most right answers over every k ≥ 2 together (ties: the weaker). Pooled, not per k: a cell holds
1–7 right of 48, so per k the choice was a coin toss (the sample KB once tied every β at k 4 on one
answer and got β 0 there, 24 right on its test split against 41 with β 4); and at k = 1 β does
nothing (one chunk: its prior log(|R|·w) is log 1 = 0).

A request's own `k` and `prior` still win. A request that sets k but not β gets the β chosen at that
k (`prior_by_k`; a k between the grid's, the largest grid k below it); a bundle built before this
record keeps GenParams' fixed defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from softknn.generate.batch import decode_loop, job_for, pack_chunks
from softknn.generate.model import Generation, Sampling
from softknn.model.attention import knn_weights_row
from softknn.retrieval.lexical import LexicalIndex
from softknn.retrieval.scoring import topk_reference

GEN_KS = (1, 2, 4, 8)
GEN_PRIORS = (0.0, 2.0, 4.0)
# pseudo-questions per KB: 48 × the grid's 10 distinct cells keep the calibration near a quarter of a
# generator build (bench/gen_build.py); 80 had taken three quarters for what stays a noisy choice
GEN_QUESTIONS = 48
GEN_MIN = 20  # fewer usable chunks: no calibration, the fixed defaults stay
GEN_TOKENS = 10  # tokens generated per answer: the blanks are short spans
SE_WIDTH = 2.0
BLANK = "____"
METHOD = ("fill-in-the-blank pseudo-questions from the KB's own chunks (a number, date or name removed; the "
          "chunk without that sentence to find), greedy answers scored by the removed span (softknn.generate.calibration)")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_MIN_WORDS = 5
# what a blank removes: an amount or a number with its unit, a date, or a run of capitalised words
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_NUMBER = (r"(?:[$£€]\s?|(?:USD|AED|GBP|EUR)\s)?\d+(?:[.,]\d+)*(?:\s?%|\s?per\s?cent|\s(?:calendar |business )?"
           r"(?:days?|weeks?|months?|years?|hours?|minutes?))?")
_DATE = rf"\d{{1,2}}\s(?:{_MONTHS})\s\d{{4}}|(?:{_MONTHS})\s\d{{4}}"
_NAME = r"(?<=[a-z,;(]\s)(?:[A-Z][a-z]+(?:\s(?:of|and|for|the)\s|\s)?){2,5}"
_SPAN = re.compile(rf"(?:{_DATE})|(?:{_NUMBER})|(?:{_NAME})")


@dataclass(frozen=True)
class BlankQuestion:
    row: int  # the chunk it came from
    question: str  # "Fill in the blank: … ____ …"
    answer: str  # the removed span
    standin: str  # the chunk without the sentence: what retrieval sees of it


def blank_question(text: str, rng: np.random.Generator) -> BlankQuestion | None:
    """A seeded pseudo-question from one chunk text (row −1), or None when no sentence of ≥ 5 words
    beside at least one other holds a span to remove."""
    parts = [s.strip() for s in _SENTENCE.split(text) if len(s.split()) >= _MIN_WORDS]
    if len(parts) < 2:
        return None
    options = []
    for i, sent in enumerate(parts):
        for m in _SPAN.finditer(sent):
            span = m.group(0).strip(" ,;")
            if span and any(ch.isalnum() for ch in span) and sent.count(span) == 1:
                options.append((i, span))
    if not options:
        return None
    i, span = options[int(rng.integers(len(options)))]
    q = parts[i].replace(span, BLANK, 1)
    return BlankQuestion(-1, f"Fill in the blank: {q}", span, " ".join(parts[:i] + parts[i + 1 :]))


def blank_questions(texts: list[str], max_questions: int = GEN_QUESTIONS, seed: int = 0) -> list[BlankQuestion]:
    """Up to max_questions pseudo-questions from a seeded sample of chunks, one per chunk, in row order."""
    rng = np.random.default_rng(seed)
    out = []
    for c in rng.permutation(len(texts)).tolist():
        q = blank_question(texts[c], rng)
        if q is not None:
            out.append(BlankQuestion(c, q.question, q.answer, q.standin))
            if len(out) == max_questions:
                break
    return sorted(out, key=lambda q: q.row)


# --- scoring: does an answer hold the reference? ------------------------------------------------------
def normalise(s: str) -> str:
    """lowercase; '.' kept only inside numbers; '$' and ':' kept; other punctuation → space; spaces collapsed."""
    s = s.lower()
    s = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", s)
    s = re.sub(r"[^\w\s.$:%]|_", " ", s)
    return " ".join(s.split())


def _match_form(s: str) -> str:
    return " ".join(normalise(s).replace("$", " ").split())  # "$9.50" and "9.50" alike


def answer_contains(answer: str, ref: str) -> bool:
    """The normalised reference appears in the normalised answer on word boundaries ("2" is not in
    "12", nor "9" in "9.50")."""
    a, r = _match_form(answer), _match_form(ref)
    if not r:
        return False
    return re.search(r"(?<![\w.])" + re.escape(r) + r"(?!\w|\.\d)", a) is not None


# --- the choice -----------------------------------------------------------------------------------------
def choose_setting(correct: np.ndarray, se_width: float = SE_WIDTH) -> tuple[int, int, np.ndarray]:
    """correct (S, n): each setting's 0/1 outcomes on the same n questions, settings ordered smallest
    first. Returns (the first setting whose mean is within se_width standard errors of the paired
    difference to the best's, the best (the first of equal means), the standard errors (S,))."""
    mean = correct.mean(1)
    top = int(np.argmax(mean))
    n = correct.shape[1]
    se = np.array([np.std(correct[s] - correct[top]) / math.sqrt(n) for s in range(len(correct))])
    return next(s for s in range(len(correct)) if mean[s] >= mean[top] - se_width * se[s] - 1e-12), top, se


def pooled_prior(right: np.ndarray, grid: list[tuple[int, float]]) -> float:
    """right (S,): each (k, β) cell's right answers. The β with the most over the cells of k ≥ 2 (where the
    prior acts), the weaker of equal ones; the weakest when the grid has k = 1 only."""
    priors = sorted({b for _, b in grid})
    total = [sum(float(right[i]) for i, (k, b) in enumerate(grid) if k >= 2 and b == beta) for beta in priors]
    return priors[int(np.argmax(total))]


def calibrate_generation(texts: list[str], xb: np.ndarray, embed: Callable[[list[str]], np.ndarray], lexical,
                         answer: Callable[[list[tuple[BlankQuestion, list[int], np.ndarray, float]]], list[str]], *,
                         lexical_weight: float, temperature: float, kernel: str = "softmax", candidates: int = 200,
                         ks: tuple[int, ...] | None = None, priors: tuple[float, ...] | None = None,
                         max_questions: int | None = None, min_questions: int = GEN_MIN,
                         se_width: float = SE_WIDTH, seed: int = 0) -> dict:
    """The manifest's `generator.calibration` record (module doc).

    xb (N, D): the chunks' embeddings; embed(texts) → (n, D) as the build embeds; lexical: the bundle's
    LexicalIndex (None: dense retrieval); answer(batch) → the generated text of each (question, R's rows,
    w_db, β) — the generator attending to R's stored memory (softknn.generate.engine does this)."""
    ks = GEN_KS if ks is None else ks  # the module's grid, read at call time
    priors = GEN_PRIORS if priors is None else priors
    pq = blank_questions(texts, GEN_QUESTIONS if max_questions is None else max_questions, seed)
    grid = [(k, float(b)) for k in sorted(ks) for b in sorted(priors)]
    base = {"method": METHOD, "seed": seed, "grid_ks": sorted(ks), "grid_priors": sorted(float(b) for b in priors)}
    if len(pq) < min_questions:
        return {**base, "questions": len(pq), "note": f"fewer than {min_questions} chunks with a blank to make: "
                "the fixed defaults stay"}
    emb = np.asarray(embed([q.question for q in pq] + [q.standin for q in pq]), dtype=np.float32)
    eq, es = emb[: len(pq)], emb[len(pq) :]
    kb = np.array(xb, dtype=np.float32)
    kb_texts = list(texts)
    for j, q in enumerate(pq):
        kb[q.row] = es[j]
        kb_texts[q.row] = q.standin
    lex = LexicalIndex.build(kb_texts, lexical.spec) if lexical is not None else None
    mode = "hybrid" if lex is not None else "dense"
    batch, hit_at = [], []
    for j, q in enumerate(pq):
        d = (kb @ eq[j]).astype(np.float64)
        b = lex.scores(lex.analyzer.terms(q.question)).astype(np.float64) if lex is not None else None
        s, ids = topk_reference(d, b, max(ks), mode, lexical_weight, candidates)
        ranked = ids.tolist()
        hit_at.append(ranked.index(q.row) + 1 if q.row in ranked else None)
        for k, beta in grid:
            w = knn_weights_row(np.ascontiguousarray(s[:k], dtype=np.float32), temperature, kernel)
            batch.append((q, ranked[:k], w, beta))
    texts_out = answer(batch)
    correct = np.array([answer_contains(t, item[0].answer) for t, item in zip(texts_out, batch, strict=True)],
                       dtype=np.float64).reshape(len(pq), len(grid)).T  # (settings, questions)
    chosen, top, se = choose_setting(correct, se_width)
    mean = correct.mean(1)
    k = grid[chosen][0]
    beta = pooled_prior(correct.sum(1), grid)
    by_k = {str(kk): beta for kk in sorted(ks)}  # kept per k: the record's shape for requests that set k
    return {**base, "k": k, "prior": beta, "prior_by_k": by_k, "questions": len(pq),
            "rule": (f"k: the smallest whose accuracy (at any β) is within {se_width:g} standard errors of the best "
                     "setting's; β: the most right answers over every k ≥ 2 together (ties: the weaker)"),
            "best": {"k": grid[top][0], "prior": grid[top][1], "accuracy": round(float(mean[top]), 4)},
            "found_in_top": {str(kk): round(sum(1 for h in hit_at if h is not None and h <= kk) / len(pq), 4)
                             for kk in sorted(ks)},
            "grid": [{"k": kk, "prior": bb, "accuracy": round(float(mean[i]), 4), "se_to_best": round(float(se[i]), 4)}
                     for i, (kk, bb) in enumerate(grid)],
            "examples": [{"question": q.question, "answer": q.answer} for q in pq[:3]]}


def answers_with_memory(generator, layers: list[int], store, recompute, batch: list[tuple[BlankQuestion, list[int],
                        np.ndarray, float]], *, max_tokens: int = GEN_TOKENS, wave: int = 128,
                        progress: bool = False) -> list[str]:
    """`answer` for calibrate_generation: each question as one user turn, R's memory read from `store`
    (a GeneratorStore; `recompute(rows)` for a recompute memory) and placed as generation places it
    (composite), joint mixing with prior β, greedy; decoded through the generator's batching decode loop
    (softknn.generate.batch), `wave` jobs in flight at a time. Items that decode the same thing are
    decoded once: one chunk gets the prior β·log(1·1) = 0 whatever β is, so (k = 1, any β) is (k = 1, β = 0)."""
    from tqdm import tqdm

    sampling = Sampling(max_tokens=max_tokens)
    loop = decode_loop(generator, layers, threads=torch.get_num_threads())  # the build's threads (its cores)
    keys = [(q.question, tuple(rows), 0.0 if len(rows) == 1 else float(beta)) for q, rows, _, beta in batch]
    first: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    todo = sorted(set(first.values()))
    texts: dict[int, str] = {}
    bar = tqdm(total=len(todo), desc="generator calibration", unit="answer", disable=not progress)
    for start in range(0, len(todo), wave):
        its = []
        for i in todo[start : start + wave]:
            q, rows, w, beta = batch[i]
            prefix, rest = generator.layout(messages=[{"role": "user", "content": q.question}])
            chunks = store.chunks(rows, recompute)
            mem = pack_chunks([c.kv for c in chunks], layers, torch.tensor(np.asarray(w)), beta, "composite",
                              generator.inv_freq, encoded_after=store.prefix_len, prefix_len=len(prefix),
                              extents=[c.extent for c in chunks])
            its.append((i, loop.submit(job_for(prefix + rest, mem, sampling))))
        for i, it in its:
            *_, last = it
            assert isinstance(last, Generation)
            texts[i] = last.text
            bar.update(1)
    bar.close()
    return [texts[first[key]] for key in keys]
