"""The evidence's fast path (evidence_items) against its plain reference (evidence_items_reference):
the same items, spans and query tokens, the same floats to round-off, on one fused pass each."""

import json
import shutil

import numpy as np
import pytest

from softknn.common.table import MAX_SPANS
from softknn.index_builder.documents import BuilderDocuments
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.infer.evidence import ChunkWords, _readable, _word_spans, chunk_words
from softknn.storage.bundle import load_bundle
from softknn.storage.writes import KBStore
from tests.numerics import assert_tree_close

TOL = 1e-5  # influence parts from the reference by a few 1e-6 (w/(1−w) < 1e3: CONDITION); every other float by ≤ 1e-8

QUESTIONS = [
    "Can I bring my dog on the Coral Line ferry to Brindlewick?",
    "refund for a cancelled sailing",
    "wheelchair access at Saltbridge Pier please",
    "What happens to sailings when a storm warning is issued for the strait?",
    "lost umbrella",
    "How do I use a context manager in Python?",
    "When does the last boat leave on Sundays?",
    "bicycles",
    "How long should I boil an egg for a soft yolk?",
    "Are there student discounts on season tickets?",
]


def queries(bundle, n_chunks: int = 6) -> list[str]:
    """The fixed questions and the first sentence of every 20th chunk of the KB (real text)."""
    own = [bundle.chunks[r]["text"].split(". ")[0][:200] for r in range(0, len(bundle), 20)][:n_chunks]
    return QUESTIONS + own


def both_paths(engine: Engine, texts: list[str], params: InferParams, monkeypatch) -> int:
    """Engine.infer with every result's evidence also built by the reference, the two compared.
    Returns how many evidence items were compared."""
    compared = []
    result = engine.result

    def checked(*args, **kwargs):
        fast = result(*args, **kwargs)
        ref = result(*args, **kwargs, reference=True)
        assert_tree_close(fast.to_dict(), ref.to_dict(), TOL)
        compared.append(len(fast.evidence))
        return fast

    monkeypatch.setattr(engine, "result", checked)
    for i in range(0, len(texts), 3):  # micro-batches of 3: padded inputs take the boolean-mask path
        engine.infer(texts[i : i + 3], params)
    monkeypatch.undo()
    assert len(compared) == len(texts)
    return sum(compared)


@pytest.mark.parametrize("retrieval", ["hybrid", "dense", "lexical"])
@pytest.mark.parametrize("k,evidence,spans", [(8, 5, 5), (1, 1, 1), (32, 32, 20), (4, 2, 0), (8, 0, 5),
                                              pytest.param(1000, 3, MAX_SPANS, marks=pytest.mark.slow)])  # every span a chunk has
def test_fast_evidence_equals_the_reference(engine, sample_bundle, retrieval, k, evidence, spans, monkeypatch):
    p = InferParams(retrieval=retrieval, k=k, evidence=evidence, spans=spans)
    n = both_paths(engine, queries(sample_bundle), p, monkeypatch)
    assert (n == 0) == (evidence == 0)


@pytest.mark.parametrize("params", [
    InferParams(mixing="joint", k=8), InferParams(mixing="joint", k=2, evidence=2),
    InferParams(alpha=1.0), InferParams(alpha=0.0, k=3), InferParams(k=8, temperature=0.005, retrieval="dense"),
    InferParams(k=2, temperature=0.5, threshold=0.01, hybrid_pool=64, evidence=50),
    InferParams(kernel="epanechnikov", temperature=0.5), InferParams(truncate=True, return_tokens=True),
])
def test_fast_evidence_equals_the_reference_across_mixing_alpha_and_kernels(engine, sample_bundle, params, monkeypatch):
    both_paths(engine, queries(sample_bundle), params, monkeypatch)


def test_near_one_weight_defers_influence_to_the_reference_form(engine, monkeypatch):
    """τ so small that one chunk holds w ≈ 1: w/(1−w) would amplify round-off past 1e-5, so the
    fast path answers with the reference's form there (and matches it)."""
    import softknn.infer.evidence as ev

    p = InferParams(retrieval="dense", temperature=0.001, k=4, evidence=4)
    calls = []
    monkeypatch.setattr(ev, "influence_reference", lambda *a, _f=ev.influence_reference, **k: calls.append(1) or _f(*a, **k))
    engine.infer(QUESTIONS[:3], p)  # the fast path alone
    monkeypatch.undo()
    assert calls  # the deferral was taken
    both_paths(engine, QUESTIONS[:3], p, monkeypatch)


def test_an_unlabelled_kb_with_an_unreadable_chunk(encoder, tmp_path, monkeypatch):
    """No labels, a chunk of markup alone (no readable word: no spans), k beyond the KB."""
    kb = tmp_path / "kb.jsonl"
    docs = [("rule", "===============\n+-------+---------+\n**********\n+-------+---------+"),
            ("ferry", "The Amber Line ferry departs at 09:00 and bicycles ride free after 7pm."),
            ("lost", "Lost property is kept at the terminal for a month."),
            ("ids", "Tickets: AB-1234-XY-99, CD-5678-ZZ-01 and https://example.org/ferries/timetable?x=1")]
    kb.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in docs))
    build_bundle(kb, tmp_path / "b", BuildConfig(), encoder, progress=False)
    bundle = load_bundle(tmp_path / "b")
    assert not bundle.labels
    row = next(i for i, c in enumerate(bundle.chunks) if c["doc_id"] == "rule")
    assert not chunk_words(bundle, row).readable.any()
    engine = Engine(encoder, bundle)
    texts = ["when does the amber ferry depart?", "=====", "lost ticket AB-1234", "----"]
    for retrieval in ("hybrid", "dense", "lexical"):
        for p in (InferParams(retrieval=retrieval, k=50, evidence=50, spans=50), InferParams(retrieval=retrieval, k=2)):
            both_paths(engine, texts, p, monkeypatch)
    (r,) = engine.infer(["====="], InferParams(retrieval="dense", k=50, evidence=50))
    assert next(e for e in r.evidence if e.doc_id == "rule").spans == []


def test_chunk_words_are_the_reference_merge(sample_bundle):
    for row in range(0, len(sample_bundle), 7):
        c = sample_bundle.chunks[row]
        st, n = int(sample_bundle.kv.start[row]), int(sample_bundle.kv.count[row])
        ref = _word_spans(np.asarray(sample_bundle.token_spans[st : st + n]), np.zeros(n))
        w = chunk_words(sample_bundle, row)
        assert [(s, e) for s, e, _, _ in ref] == list(zip(w.start.tolist(), w.end.tolist(), strict=True))
        assert [toks[0] for *_, toks in ref] == w.first.tolist()
        assert [len(toks) for *_, toks in ref] == w.length.tolist()
        assert [_readable(c["text"][s - c["start"] : e - c["start"]]) for s, e, _, _ in ref] == w.readable.tolist()


def test_the_word_cache_keeps_at_most_its_size_and_the_recent_rows(sample_bundle):
    cache = ChunkWords(sample_bundle, size=3)
    for row in (0, 1, 2, 0, 3):
        cache(row)
    assert list(cache._rows) == [2, 0, 3]


def test_after_a_write_the_new_version_answers_its_own_words(encoder, sample_bundle_path, tmp_path, monkeypatch):
    """A write makes a new bundle and an Engine over it a new word cache: the rewritten chunk's
    spans come from its new text, and the fast path still equals the reference."""
    shutil.copytree(sample_bundle_path, tmp_path / "b")
    store = KBStore(tmp_path / "b", encoder, documents=BuilderDocuments())
    try:
        text = "Can I bring my dog on the Coral Line ferry to Brindlewick?"
        p = InferParams(k=8, evidence=8, spans=50)
        before = Engine(encoder, store.bundle)
        (old,) = before.infer([text], p)
        doc = old.evidence[0].doc_id
        new_text = "Dogs travel free on every Coral Line ferry to Brindlewick, leashed, in the outdoor deck area."
        store.put(doc, {"text": new_text})
        after = Engine(encoder, store.bundle)
        both_paths(after, [text, "dog on the ferry", "leashed dogs outdoor deck"], p, monkeypatch)
        (r,) = after.infer([text], p)
        ev = next(e for e in r.evidence if e.doc_id == doc)
        assert ev.text == new_text and ev.spans
        assert all(new_text[s.start - ev.start : s.end - ev.start] == s.text for s in ev.spans)
    finally:
        store.close()
