"""KB writes (softknn.storage.writes): after any sequence of puts and deletes, every answer equals a
fresh `softknn build` of the resulting KB (written as one JSONL file in KB order): exact and
default retrieval, evidence ids and order, BM25 scores (N, df, avgdl), label scores, the embedding."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from softknn.common.errors import BundleError, DocumentNotFound, KBFormatError, WriteRefused
from softknn.index_builder.documents import BuilderDocuments
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.index_builder.reader import read_kb
from softknn.infer.engine import Engine, InferParams
from softknn.retrieval.lexical import bm25_reference
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import verify_bundle
from softknn.storage.writes import WAL, KBStore, read_log, verify_log, version_seq, writable
from tests.numerics import assert_tree_close

QUERIES = ["how much is an adult single from harrowmere to saltbridge?",
           "can I bring my bicycle on the ferry?",
           "what happens when a sailing is cancelled for weather?",
           "lost property at the terminal",
           "zzqx unknownword"]
TOL = 1e-4


def kb_records(kb: Path) -> dict[str, dict]:
    """The KB as the builder reads it, doc id -> record, in its order."""
    return {d.doc_id: {"text": d.text, "label": d.label, "metadata": d.metadata} for d in read_kb(kb)}


def write_kb(records: dict[str, dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for doc_id, r in records.items():
            f.write(json.dumps({"id": doc_id, **{k: v for k, v in r.items() if v is not None}}) + "\n")
    return path


PARAMS = (InferParams(exact=True, evidence=8), InferParams(evidence=8))  # hybrid: dense and BM25 both count
MORE_PARAMS = (InferParams(exact=True, retrieval="lexical", evidence=8), InferParams(retrieval="dense", evidence=8))


def answers(engine: Engine, params=PARAMS, queries=QUERIES) -> list[dict]:
    out = []
    for p in params:
        out += [r.to_dict() for r in engine.infer(queries, p)]  # everything: evidence, bm25, diagnostics
    return out


def fresh_build(records: dict[str, dict], encoder, tmp: Path, memory: str = "hidden"):
    fresh = tmp / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    build_bundle(write_kb(records, tmp / "kb.jsonl"), fresh, BuildConfig(memory=memory), encoder, progress=False, force=True)
    return load_bundle(fresh)


def assert_same_as_fresh_build(store: KBStore, records: dict[str, dict], encoder, tmp: Path, *, want=None,
                               params=PARAMS, queries=QUERIES) -> None:
    want = want if want is not None else fresh_build(records, encoder, tmp)
    got = store.bundle
    assert [c for c in got.chunks] == [c for c in want.chunks]  # rows, ids, texts, spans, labels, metadata
    np.testing.assert_allclose(np.asarray(got.index.xb), np.asarray(want.index.xb), atol=TOL)
    assert got.labels == want.labels
    for key in ("counts", "labels", "label_counts", "index"):
        assert got.manifest.raw[key] == want.manifest.raw[key], key
    assert got.manifest.raw["lexical"] == want.manifest.raw["lexical"]
    cal_got, cal_want = got.manifest.raw["calibration"], want.manifest.raw["calibration"]
    assert_tree_close(cal_got, cal_want, TOL)
    # BM25 over the whole KB: N, df, avgdl of the new KB (the written formula over its chunks' terms)
    a = got.lexical.analyzer
    docs = [a.terms(c["text"]) for c in want.chunks]
    for q in QUERIES:
        terms = a.terms(q)
        np.testing.assert_allclose(got.lexical.scores(terms), want.lexical.scores(terms), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got.lexical.scores(terms), bm25_reference(terms, docs), rtol=1e-5, atol=1e-5)
    assert_tree_close(answers(Engine(encoder, got), params, queries), answers(Engine(encoder, want), params, queries), TOL)


def random_ops(rng: random.Random, records: dict[str, dict], n: int) -> list[tuple[str, str, dict | None]]:
    """n puts (replacing, new, re-adding a deleted id) and deletes, drawn by `rng`. Every text put is
    new to the KB (a drawn serial number in it): two chunks of one text tie exactly in a fresh build, and
    which of them ranks first then rides on the last bits of two embeddings computed in different
    batches, so such a tie would compare noise, not the write path (a CI machine flipped one)."""
    ids = list(records)
    texts = [r["text"] for r in records.values()]
    ops = []
    live = dict(records)
    for i in range(n):
        r = rng.random()
        if r < 0.3 and len(live) > 2:
            doc = rng.choice(list(live))
            ops.append(("delete", doc, None))
            live.pop(doc)
        elif r < 0.6:
            doc = rng.choice(list(live))
            new = {"text": rng.choice(texts) + f" Update {rng.randrange(10**6)}: the harbourmaster's bicycle rule.",
                   "label": rng.choice([None, "tickets_and_fares", "a_new_label"]), "metadata": {"n": i}}
            ops.append(("put", doc, new))
            live[doc] = new
        else:
            doc = rng.choice([f"new-{i}", rng.choice(ids)])
            words = rng.choice(texts).split()[: rng.randint(3, 400)]
            new = {"text": " ".join(words) + f" (copy {rng.randrange(10**6)})", "label": None, "metadata": {}}
            ops.append(("put", doc, new))
            live[doc] = new  # a new id, or a deleted one coming back: at the end; a live one keeps its place
    return ops


def apply(store: KBStore, records: dict[str, dict], ops) -> dict[str, dict]:
    records = dict(records)
    for op, doc, body in ops:
        if op == "put":
            store.put(doc, body)
            records[doc] = body
        else:
            store.delete(doc)
            records.pop(doc)
    return records


@pytest.fixture()
def bundle_copy(tmp_path, sample_bundle_path) -> Path:
    out = tmp_path / "b"
    shutil.copytree(sample_bundle_path, out)
    return out


def test_a_few_random_writes_answer_as_a_fresh_build(bundle_copy, encoder, sample_kb, tmp_path):
    records = kb_records(sample_kb)
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    ops = random_ops(random.Random(7), records, 5)
    ops.append(("put", "handbook/03_cancellations.md" if "handbook/03_cancellations.md" in records
                else next(d for d in records if d.startswith("handbook/")),
                {"text": "Short now: cancellations are posted at the pier.", "label": None}))  # long doc → one chunk
    records = apply(store, records, ops)
    assert store.seq == len(ops) and version_seq(store.bundle.version) == len(ops)
    want = fresh_build(records, encoder, tmp_path)
    assert_same_as_fresh_build(store, records, encoder, tmp_path, want=want, queries=QUERIES[:3])
    store.close()
    # reopened: the log replays to the same KB
    store.close()
    again = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    assert again.bundle.version == store.bundle.version
    assert [c["chunk_id"] for c in again.bundle.chunks] == [c["chunk_id"] for c in store.bundle.chunks]
    # compacted: a new base, the same answers, an empty log; verify passes
    result = again.compact()
    assert result["writes_folded"] == len(ops) and result["recalibrated"] is True
    verify_bundle(bundle_copy)
    assert verify_log(bundle_copy)["records"] == 0
    assert version_seq(again.bundle.version) == len(ops)  # the version keeps moving forward
    assert_same_as_fresh_build(again, records, encoder, tmp_path, want=want, params=PARAMS[:1], queries=QUERIES[:3])
    again.close()


def test_writes_on_a_kv_bundle_answer_as_a_fresh_kv_build(encoder, tmp_path):
    """The sample bundle (above) stores the default `hidden`; `--memory kv` takes the same writes:
    puts, a delete and a compaction, each answering as a fresh kv build of the resulting KB."""
    records = {f"k-{i}": {"text": t, "label": lab, "metadata": {}} for i, (t, lab) in enumerate([
        ("An adult single from Harrowmere to Saltbridge costs twelve pounds.", "fares"),
        ("Bicycles travel free on the car deck; book a space in advance.", "bikes"),
        ("When a sailing is cancelled for weather you get a full refund.", "weather"),
        ("Lost property is kept at the terminal office for thirty days.", "lost")])}
    base = tmp_path / "base"
    build_bundle(write_kb(records, tmp_path / "kb0.jsonl"), base, BuildConfig(memory="kv"), encoder, progress=False)
    store = KBStore(base, encoder, documents=BuilderDocuments())
    records = apply(store, records, [("put", "k-1", {"text": "Bicycles cost two pounds each way from March.", "label": "bikes"}),
                                     ("put", "k-9", {"text": "Dogs on a lead are welcome in the lounge.", "label": None}),
                                     ("delete", "k-3", None)])
    want = fresh_build(records, encoder, tmp_path, memory="kv")
    assert store.bundle.manifest.memory == want.manifest.memory == "kv"
    assert_same_as_fresh_build(store, records, encoder, tmp_path, want=want, queries=QUERIES[:3])
    store.compact()
    assert sorted(f for f in verify_bundle(base)["files"] if f.startswith(("kv_", "mem_"))) == ["kv_keys.npy", "kv_values.npy"]
    assert_same_as_fresh_build(store, records, encoder, tmp_path, want=want, params=PARAMS[:1], queries=QUERIES[:3])
    store.close()


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 36 writes, 6 fresh builds, 4 × 5 answers each: one seed ran 7 min at load 12 here, the next past the suite's 600 s
@pytest.mark.parametrize("seed", [1])  # one long sequence: seeds 2 and 3 repeated the same proof
def test_long_random_write_sequences_answer_as_fresh_builds(bundle_copy, encoder, sample_kb, tmp_path, seed):
    records = kb_records(sample_kb)
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    rng = random.Random(seed)
    for round_ in range(3):
        records = apply(store, records, random_ops(rng, records, 12))
        want = fresh_build(records, encoder, tmp_path)
        assert_same_as_fresh_build(store, records, encoder, tmp_path, want=want, params=PARAMS + MORE_PARAMS)
        if round_ == 1:
            store.compact()
            assert_same_as_fresh_build(store, records, encoder, tmp_path, want=want, params=PARAMS + MORE_PARAMS)
    store.close()


def test_deleting_every_chunk_with_a_term_leaves_no_trace_of_it(bundle_copy, encoder):
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    store.put("odd-1", {"text": "The quixotic zephyr timetable."})
    lex = store.bundle.lexical
    assert lex.scores(lex.analyzer.terms("zephyr")).max() > 0
    n = len(store.bundle)
    store.delete("odd-1")
    lex = store.bundle.lexical
    assert len(store.bundle) == n - 1 and "zephyr" not in lex.vocab
    assert store.bundle.manifest.counts.docs == len({c["doc_id"] for c in store.bundle.chunks})
    store.close()


def test_refusals_name_the_problem(bundle_copy, encoder):
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    with pytest.raises(DocumentNotFound, match="no document 'nope'"):
        store.delete("nope")
    with pytest.raises(DocumentNotFound):
        store.document("nope")
    with pytest.raises(KBFormatError, match="missing or empty text"):
        store.put("x", {"text": "   "})
    with pytest.raises(KBFormatError, match="label"):
        store.put("x", {"text": "ok", "label": {"a": 1}})
    with pytest.raises(KBFormatError, match="not blank"):
        store.put(" ", {"text": "ok"})
    assert store.seq == 0 and not (bundle_copy / WAL).exists()  # nothing refused was logged
    doc = store.document("faq-0001")
    assert doc["chunks"][0]["chunk_id"] == "faq-0001" and doc["label"] == "tickets_and_fares"
    store.close()


def test_sharded_and_other_unsupported_bundles_refuse_writes(sample_bundle):
    m = sample_bundle.manifest
    with pytest.raises(WriteRefused, match="not supported on sharded bundles"):
        writable(m.replaced(shards=[{"dir": "shard-0000", "rows": [0, 10], "version_id": "x"}]))
    with pytest.raises(WriteRefused, match="hidden-int8"):
        writable(m.replaced(memory="hidden-int8"))
    writable(m)


def test_a_torn_tail_is_dropped_and_a_corrupt_middle_refused(bundle_copy, encoder):
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    store.put("a", {"text": "first written document about ferries"})
    store.put("b", {"text": "second written document about piers"})
    store.close()
    wal = bundle_copy / WAL
    data = wal.read_bytes()
    wal.write_bytes(data + data[:30])  # a third record that died mid-append
    assert verify_log(bundle_copy)["torn_bytes"] == 30
    again = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    assert again.seq == 2 and wal.read_bytes() == data  # cut back to the last whole record
    again.close()
    flipped = bytearray(data)
    flipped[40] ^= 0xFF  # inside the first record: the second one follows it
    wal.write_bytes(bytes(flipped))
    with pytest.raises(BundleError, match="corrupt write log"):
        read_log(wal)


def test_a_compaction_stopped_between_its_two_renames_recovers_the_old_bundle_and_its_log(
        bundle_copy, encoder, sample_kb, tmp_path, monkeypatch):
    """finalize moves the old bundle aside, then renames the new one in: a crash between the two
    leaves no bundle at its path. Opening it again restores the old one, whose log still holds every
    acknowledged write, and removes a half-written compaction."""
    import softknn.storage.bundle

    records = kb_records(sample_kb)
    store = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    ops = [("put", "new-doc", {"text": "The harbour office opens at six on Sundays.", "label": None}),
           ("delete", "faq-0003", None)]
    records = apply(store, records, ops)
    version = store.bundle.version
    real_replace = softknn.storage.bundle.os.replace
    calls = []

    def crash_before_the_new_one_moves_in(src, dst):
        if Path(dst) == bundle_copy and Path(src).name.startswith(f".{bundle_copy.name}.tmp-compact-"):
            raise KeyboardInterrupt("killed between the renames")
        calls.append((src, dst))  # the manifest's atomic write, then the old bundle moved aside
        return real_replace(src, dst)

    monkeypatch.setattr(softknn.storage.bundle.os, "replace", crash_before_the_new_one_moves_in)
    with pytest.raises(KeyboardInterrupt):
        store.compact()
    monkeypatch.setattr(softknn.storage.bundle.os, "replace", real_replace)
    store.close()
    aside = Path(calls[-1][1])
    assert not bundle_copy.exists() and aside.is_dir() and Path(calls[-1][0]) == bundle_copy  # only the old one, aside
    stale = bundle_copy.parent / f".{bundle_copy.name}.tmp-compact-deadbeef"
    stale.mkdir()
    again = KBStore(bundle_copy, encoder, documents=BuilderDocuments())
    assert again.bundle.version == version and not stale.exists() and not aside.exists()
    assert_same_as_fresh_build(again, records, encoder, tmp_path, params=PARAMS[:1], queries=QUERIES[:2])
    assert again.compact()["writes_folded"] == len(ops)  # and the compaction then completes
    verify_bundle(bundle_copy)
    again.close()
