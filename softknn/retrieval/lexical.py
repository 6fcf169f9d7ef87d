"""The KB's lexical index: BM25 over each chunk's analysed words (bm25s: sparse matrices, no server).

One `Analyzer` turns text into terms for the index and for queries alike: words are
`\\b\\w\\w+\\b` runs of the lower-cased text (bm25s's own token pattern), English stopwords
(bm25s's list; with `stopwords="en+questions"` also QUESTION_WORDS) are dropped and the rest are
Snowball-stemmed (PyStemmer). Its settings and the BM25 parameters are stored in the manifest
(`lexical`), so a bundle rebuilds and re-analyses from them, with the stopword list it was built with.

`LexicalIndex.scores(terms)` is BM25(q, c) for every chunk c of the KB (N,), read from the
posting lists of the query's terms (bm25s's precomputed per-(term, chunk) scores, Lucene's
formula); `bm25_reference` is the same formula written out over raw term counts, the plain
reference the tests compare it with.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from softknn.common.errors import BundleError

LEXICAL_DIR = "lexical"
# what bm25s.BM25.save writes (allow_pickle=False); all under the bundle's checksums
LEXICAL_FILES = tuple(f"{LEXICAL_DIR}/{name}" for name in (
    "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "vocab.index.json", "params.index.json"))


@dataclass(frozen=True)
class LexicalSpec:
    """How text becomes terms and terms become scores; stored as the manifest's `lexical`."""

    library: str = "bm25s"
    method: str = "lucene"  # BM25 variant (bm25s `method`): idf = ln(1 + (N − df + 0.5)/(df + 0.5))
    k1: float = 0.9  # ObliQA validation, hybrid nDCG@10: 0.716 (k1 0.9) vs 0.707 (1.5); bench/hybrid_obliqa.py
    b: float = 0.75
    token_pattern: str = r"(?u)\b\w\w+\b"
    lowercase: bool = True
    # "en": bm25s's English list; "en+questions": that and QUESTION_WORDS, the default for new builds
    # (bench unlabelled_lambda: equal to or better than "en" in every cell on the Python topics,
    # Banking77 and ObliQA, at λ 0.6 and at the KB's own λ); a bundle keeps the list it was built with
    stopwords: str = "en+questions"
    stemmer: str = "english"  # Snowball, via PyStemmer; "" for none

    def to_manifest(self) -> dict:
        return asdict(self)

    @classmethod
    def from_manifest(cls, m: dict) -> LexicalSpec:
        # a bundle keeps the analyser it was built with: one stored without a stopword list had "en"
        known = {"stopwords": "en", **{k: m[k] for k in cls.__dataclass_fields__ if k in m}}
        return cls(**known)


# Words that shape a question rather than say what it is about: interrogatives, the auxiliaries a
# question is built with, the asker's pronouns and "please". bm25s's English list keeps them, so
# "what does the with statement do" matched chunks on "what", "does" and "do" rather than on its
# subject. A bundle records the list by name ("en+questions"): changing these words means a new name,
# so that a bundle built before keeps analysing as it was built.
QUESTION_WORDS = frozenset({
    "what", "which", "who", "whom", "whose", "when", "where", "why", "how",
    "do", "does", "did", "can", "could", "would", "should", "shall", "may", "might", "must",
    "am", "were", "been", "being", "has", "have", "had",
    "i", "me", "my", "you", "your", "we", "us", "our",
    "please",
})


def stopword_set(name: str) -> frozenset[str]:
    """The words a spec's `stopwords` names: "en" (bm25s's list), "en+questions" (that and
    QUESTION_WORDS) or "" (none)."""
    from bm25s.stopwords import STOPWORDS_EN

    sets = {"en": frozenset(STOPWORDS_EN), "en+questions": frozenset(STOPWORDS_EN) | QUESTION_WORDS, "": frozenset()}
    if name not in sets:
        raise ValueError(f"stopwords must be one of {sorted(sets)}, not {name!r}")
    return sets[name]


class Analyzer:
    """text → [(term, start, end)]: the kept words with their char spans (for the matched words)."""

    def __init__(self, spec: LexicalSpec):
        import Stemmer

        self.spec = spec
        self._word = re.compile(spec.token_pattern)
        self._stop = stopword_set(spec.stopwords)
        self._stem = Stemmer.Stemmer(spec.stemmer).stemWord if spec.stemmer else (lambda w: w)

    def words(self, text: str) -> list[tuple[str, int, int]]:
        src = text.lower() if self.spec.lowercase else text
        out = []
        for m in self._word.finditer(src):
            w = m.group()
            if w not in self._stop:
                out.append((self._stem(w), m.start(), m.end()))
        return out

    def terms(self, text: str) -> list[str]:
        return [t for t, _, _ in self.words(text)]


class LexicalIndex:
    """BM25 over N chunks. `scores(terms)` (N,) float32; `matched(terms, c)` the terms in chunk c."""

    def __init__(self, retriever, spec: LexicalSpec):
        self.retriever = retriever
        self.spec = spec
        self.analyzer = Analyzer(spec)
        s = retriever.scores
        self.n = int(s["num_docs"])
        # plain views of bm25s's (memory-mapped) arrays: slicing a np.memmap costs a Python call each time
        self._indices, self._indptr = np.asarray(s["indices"]), np.asarray(s["indptr"])
        self.vocab: dict[str, int] = retriever.vocab_dict

    @classmethod
    def build(cls, texts: list[str], spec: LexicalSpec = LexicalSpec()) -> LexicalIndex:
        analyzer = Analyzer(spec)
        return cls.from_terms([analyzer.terms(t) for t in texts], spec)

    @classmethod
    def from_terms(cls, corpus: list[list[str]], spec: LexicalSpec = LexicalSpec()) -> LexicalIndex:
        """`build` from each chunk's analysed terms (Analyzer.terms): a KB that takes writes keeps
        them per chunk, so a new version re-analyses only the written chunks."""
        import bm25s

        # bm25s needs ≥ 1 token per document to size its matrix: an all-stopword chunk gets the
        # empty term, which no query ever produces (Analyzer never yields "")
        corpus = [t if t else [""] for t in corpus]
        # term ids in sorted order: bm25s numbers a list of strings in set order, which changes with
        # PYTHONHASHSEED, and the builder promises the same bytes for the same input
        vocab = {t: i for i, t in enumerate(sorted({t for doc in corpus for t in doc}))}
        r = bm25s.BM25(method=spec.method, k1=spec.k1, b=spec.b)
        r.index(([[vocab[t] for t in doc] for doc in corpus], vocab), show_progress=False)
        return cls(r, spec)

    def save(self, bundle_dir: Path) -> None:
        self.retriever.save(Path(bundle_dir) / LEXICAL_DIR, show_progress=False)

    @classmethod
    def load(cls, bundle_dir: Path, spec: LexicalSpec) -> LexicalIndex:
        import bm25s

        try:
            r = bm25s.BM25.load(str(Path(bundle_dir) / LEXICAL_DIR), mmap=True, load_corpus=False)
        except (OSError, ValueError, json.JSONDecodeError) as e:
            raise BundleError(f"{Path(bundle_dir) / LEXICAL_DIR}: unreadable lexical index: {e}") from e
        return cls(r, spec)

    def __len__(self) -> int:
        return self.n

    def term_ids(self, terms: list[str]) -> list[int]:
        """Vocabulary ids of the query's terms, repeats kept (a repeated word counts twice, as in bm25s)."""
        return [self.vocab[t] for t in terms if t and t in self.vocab]

    def postings(self, term_ids: list[int]) -> int:
        """Posting-list entries of these term ids, summed: the (term, chunk) pairs scoring them reads."""
        p = self._indptr
        return int(sum(int(p[i + 1]) - int(p[i]) for i in term_ids))

    @property
    def n_postings(self) -> int:
        """Posting-list entries of the whole index: its (term, chunk) pairs."""
        return int(self._indptr[-1])

    def scores(self, terms: list[str]) -> np.ndarray:
        """(N,) float32: BM25(q, c) for every chunk; 0 where no query term occurs in c."""
        ids = self.term_ids(terms)
        if not ids:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32)

    def matched(self, terms: list[str], c: int) -> set[str]:
        """The distinct query terms that occur in chunk c (posting lists are sorted by chunk)."""
        out = set()
        for t in set(terms):
            i = self.vocab.get(t)
            if i is None or i + 1 >= len(self._indptr):
                continue
            post = self._indices[self._indptr[i] : self._indptr[i + 1]]
            j = np.searchsorted(post, c)
            if j < len(post) and post[j] == c:
                out.add(t)
        return out

    def matched_rows(self, terms: list[str], rows: list[int]) -> list[set[str]]:
        """`matched(terms, c)` for each chunk c of rows: one search of each term's postings for all of them."""
        r = np.asarray(rows, dtype=np.int64)  # (R,)
        out: list[set[str]] = [set() for _ in rows]
        for t in set(terms):
            i = self.vocab.get(t)
            if i is None or i + 1 >= len(self._indptr):
                continue
            post = self._indices[self._indptr[i] : self._indptr[i + 1]]
            if not len(post):
                continue
            j = np.minimum(np.searchsorted(post, r), len(post) - 1)  # (R,)
            for k in np.flatnonzero(post[j] == r).tolist():
                out[k].add(t)
        return out


def bm25_reference(query_terms: list[str], docs: list[list[str]], spec: LexicalSpec = LexicalSpec()) -> np.ndarray:
    """Lucene BM25 written out (the plain reference of LexicalIndex.scores):

    score(q, d) = Σ_{t ∈ q} idf(t) · tf(t,d) / (tf(t,d) + k1·(1 − b + b·|d|/avgdl)),
    idf(t) = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5)), repeated query terms counted each time.
    """
    if spec.method != "lucene":
        raise ValueError("the reference implements method='lucene' only")
    docs = [d if d else [""] for d in docs]
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df = Counter(t for d in docs for t in set(d))
    out = np.zeros(n, dtype=np.float64)
    for j, d in enumerate(docs):
        tf = Counter(d)
        norm = spec.k1 * (1 - spec.b + spec.b * len(d) / avgdl)
        for t in query_terms:
            if tf.get(t):
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                out[j] += idf * tf[t] / (tf[t] + norm)
    return out
