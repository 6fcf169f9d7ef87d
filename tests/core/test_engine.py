"""The contract end to end on the real model and the sample bundle (real FAISS)."""

import json

import numpy as np
import pytest
import torch

from softknn.common.table import MAX_SPANS
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.infer.evidence import _word_spans
from softknn.infer.reference import reference_embedding
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import lexical_summary

QUERY = "Can I bring my dog on the Coral Line ferry to Brindlewick?"


def test_alpha_one_reproduces_the_unmodified_model(engine, encoder):
    texts = [QUERY, "lost umbrella", "What happens to sailings when a storm warning is issued for the strait?"]
    res = engine.infer(texts, InferParams(alpha=1.0, k=8))
    plain = encoder.st.encode(texts, convert_to_numpy=True)
    got = np.array([r.embedding for r in res])
    assert np.abs(got - plain).max() <= 1e-5
    assert all(r.diagnostics.memory_share == 0.0 for r in res)


@pytest.mark.parametrize("mixing", ["fixed", "joint"])
def test_exact_full_kb_equals_brute_force_reference(engine, encoder, sample_bundle, mixing):
    n = len(sample_bundle)
    res = engine.infer([QUERY], InferParams(alpha=0.7, mixing=mixing, k=n, temperature=0.05, exact=True, evidence=n,
                                            retrieval="dense"))
    ref, rows, w = reference_embedding(encoder, sample_bundle, QUERY, alpha=0.7, mixing=mixing, k=n, temperature=0.05)
    assert len(rows) == n
    assert np.abs(np.array(res[0].embedding) - ref).max() <= 1e-5
    got_w = {e.chunk_id: e.weight for e in res[0].evidence}
    ref_w = {sample_bundle.chunks[r]["chunk_id"]: x for r, x in zip(rows, w)}
    assert got_w.keys() == ref_w.keys()
    assert max(abs(got_w[c] - ref_w[c]) for c in ref_w) <= 1e-6


def test_ann_free_topk_equals_reference_at_small_k(engine, encoder, sample_bundle):
    res = engine.infer([QUERY], InferParams(alpha=0.5, k=5, temperature=0.1, exact=True, retrieval="dense"))
    ref, rows, _ = reference_embedding(encoder, sample_bundle, QUERY, alpha=0.5, mixing="fixed", k=5, temperature=0.1)
    assert [e.chunk_id for e in sorted(res[0].evidence, key=lambda e: -e.similarity)] == [
        sample_bundle.chunks[r]["chunk_id"] for r in rows
    ]
    assert np.abs(np.array(res[0].embedding) - ref).max() <= 1e-5


def test_fixed_memory_shares_sum_to_one_minus_alpha(engine):
    r = engine.infer([QUERY], InferParams(alpha=0.7, k=8, evidence=8))[0]
    shares = [e.mass_share for e in r.evidence]
    assert len(shares) == 8
    assert sum(shares) == pytest.approx(0.3, abs=1e-6)
    assert r.diagnostics.memory_share == pytest.approx(0.3, abs=1e-6)
    for e in r.evidence:  # in fixed mode each share is exactly (1 − α)·w_db
        assert e.mass_share == pytest.approx(0.3 * e.weight, abs=1e-6)
    assert shares == sorted(shares, reverse=True)


def test_joint_memory_share_is_reported_not_set(engine):
    r = engine.infer([QUERY], InferParams(mixing="joint", k=8, evidence=8))[0]
    total = sum(e.mass_share for e in r.evidence)
    assert 0.0 < total < 1.0
    assert r.diagnostics.memory_share == pytest.approx(total, abs=1e-6)
    assert r.diagnostics.alpha is None


def test_label_scores_are_the_nadaraya_watson_estimate(engine):
    r = engine.infer([QUERY], InferParams(k=6, evidence=6))[0]
    expected: dict[str, float] = {}
    for e in r.evidence:
        if e.label is not None:
            expected[e.label] = expected.get(e.label, 0.0) + e.weight
    assert r.label_scores.keys() == expected.keys()
    for lab, score in expected.items():
        assert r.label_scores[lab] == pytest.approx(score, abs=1e-7)
    assert r.prediction == max(expected, key=expected.get)


def test_spans_round_trip_to_the_original_documents(engine, sample_kb):
    docs = {}
    for line in (sample_kb / "kb.jsonl").read_text().splitlines():
        rec = json.loads(line)
        docs[rec["id"]] = rec["text"]
    for p in (sample_kb / "handbook").glob("*.md"):
        docs[f"handbook/{p.name}"] = p.read_text()
    texts = [QUERY, "Which vessel covers the Dusk Line when the Ossary Star is in dry dock?"]
    for r, text in zip(engine.infer(texts, InferParams(k=8, evidence=8, spans=10)), texts):
        assert r.evidence
        for e in r.evidence:
            doc = docs[e.doc_id]
            assert doc[e.start : e.end] == e.text
            for sp in e.spans:
                assert doc[sp.start : sp.end] == sp.text
                for qt in sp.query_tokens:
                    assert qt.text == "[special]" or text[qt.start : qt.end] == qt.text


def test_stored_chunk_memory_equals_recomputing_the_chunk(encoder, sample_bundle):
    rows = [0, 7, len(sample_bundle) - 1]
    texts = [sample_bundle.chunks[r]["text"] for r in rows]
    emb = encoder.st.encode(texts, convert_to_numpy=True)
    assert np.abs(np.asarray(sample_bundle.index.xb)[rows] - emb).max() <= 1e-5
    layer = sample_bundle.memory_layer
    sample_bundle.kv.attach(encoder, encoder.check_layer(layer))  # the default memory, hidden, projects with the model
    for r, text in zip(rows, texts):
        batch = encoder.tokenize([text])
        plain = encoder.forward_plain(batch, capture_layer=layer)
        keep = ~batch.special[0]
        kc, vc = sample_bundle.kv.chunk(r)
        assert torch.allclose(kc, plain.key[0][:, keep], atol=1e-5, rtol=0)
        assert torch.allclose(vc, plain.value[0][:, keep], atol=1e-5, rtol=0)


def test_batched_inputs_with_different_params_equal_their_solo_results(engine):
    texts = [QUERY, "refund for a cancelled sailing", "wheelchair access at Saltbridge Pier please"]
    params = [InferParams(alpha=0.3, k=4), InferParams(mixing="joint", k=8, temperature=0.1), InferParams(k=2, exact=True)]
    together = engine.infer(texts, params)
    for text, p, r in zip(texts, params, together):
        solo = engine.infer([text], p)[0]
        assert np.abs(np.array(solo.embedding) - np.array(r.embedding)).max() <= 1e-5
        assert [e.chunk_id for e in solo.evidence] == [e.chunk_id for e in r.evidence]


def test_diagnostics_entropy_and_effective_k(engine):
    r = engine.infer([QUERY], InferParams(k=8, temperature=0.05))[0]
    d = r.diagnostics
    w = np.array([e.weight for e in engine.infer([QUERY], InferParams(k=8, temperature=0.05, evidence=8))[0].evidence])
    h = float(-(w * np.log(w)).sum())
    assert d.w_db_entropy == pytest.approx(h, abs=1e-5)
    assert d.w_db_effective_k == pytest.approx(np.exp(h), rel=1e-5)  # exp(H) amplifies H's error: relative
    assert 1.0 <= d.w_db_effective_k <= 8.0
    assert 0.0 < d.truncation_bound < 1.0
    assert d.attention_effective_k == pytest.approx(np.exp(d.attention_entropy), rel=1e-5)


def test_hybrid_threshold_keeps_topk_plus_heavy_pool_chunks(engine):
    base = engine.infer([QUERY], InferParams(k=2, temperature=0.5, evidence=50))[0]
    hyb = engine.infer([QUERY], InferParams(k=2, temperature=0.5, threshold=0.01, hybrid_pool=64, evidence=50))[0]
    assert base.diagnostics.retrieved == 2
    assert hyb.diagnostics.retrieved > 2  # a flat τ spreads weight over the pool beyond top-2
    top2 = [e.chunk_id for e in sorted(base.evidence, key=lambda e: -e.similarity)]
    hyb_ids = [e.chunk_id for e in sorted(hyb.evidence, key=lambda e: -e.similarity)]
    assert hyb_ids[:2] == top2


def test_influence_matches_removing_the_chunk_and_renormalising(engine, encoder, sample_bundle):
    """Closed-form influence vs. actually rerunning the layer without the chunk (weights renormalised)."""
    from softknn.model.attention import fused_attention

    text, p = QUERY, InferParams(alpha=0.6, k=4, evidence=4)
    r = engine.infer([text], p)[0]
    ev = r.evidence[0]
    batch = encoder.tokenize([text])
    plain = encoder.forward_plain(batch, keep_hidden=True)
    retr = engine.retrieve(plain.embedding.numpy(), engine.resolve([p]), batch.texts)
    row = sample_bundle.row_of(ev.chunk_id)
    outs = {}
    for name, rows, ws in [("all", retr.rows[0], retr.weights[0]),
                           ("minus", [x for x in retr.rows[0] if x != row],
                            [w for x, w in zip(retr.rows[0], retr.weights[0]) if x != row])]:
        ws = [w / sum(ws) for w in ws]
        mem = sample_bundle.kv.gather([rows], [ws], torch.device("cpu"))

        def fuse(q, k, v, scaling, mem=mem, name=name):
            outs[name] = fused_attention(q, k, v, batch.mask, mem, alpha=torch.tensor([0.6]), joint=torch.tensor([False]),
                                            scaling=scaling).out
            return outs[name]

        encoder.forward_fused(batch, sample_bundle.memory_layer, fuse, plain)
    delta = (outs["minus"] - outs["all"]).norm() / outs["all"].norm()
    assert ev.influence == pytest.approx(float(delta), rel=1e-4)


def test_chunk_query_tokens_rank_by_reach_and_are_informative_in_fixed_mode(engine):
    r = engine.infer([QUERY], InferParams(alpha=0.7, k=4, evidence=4))[0]
    n = r.diagnostics.n_tokens
    for e in r.evidence:
        weights = [q.weight for q in e.query_tokens]
        assert weights == sorted(weights, reverse=True)
        assert len(set(round(w, 6) for w in weights)) > 1  # not the constant (1 − α)·w_db
        assert all(0.0 < w < 1.0 for w in weights) and sum(weights) <= 1.0 + 1e-6
        assert len(e.query_tokens) == min(5, n)


def test_calibrated_gate_abstains_out_of_domain_and_a_request_threshold_overrides_it(engine, sample_bundle):
    saved = sample_bundle.manifest
    sample_bundle.manifest = saved.replaced(calibration={"abstain_threshold": 0.0, "min_similarity": 0.35,
                                                         "abstain_threshold_gated": 0.0})
    try:
        ood, ind = engine.infer(["How long should I boil an egg for a soft yolk?", QUERY], InferParams(k=8, evidence=8))
        s1 = ood.diagnostics.nearest_similarity  # the dense top-1, whatever R was ranked by
        dense = engine.infer(["How long should I boil an egg for a soft yolk?"], InferParams(k=8, evidence=8,
                                                                                           retrieval="dense"))[0]
        assert s1 == pytest.approx(max(e.similarity for e in dense.evidence), abs=1e-6)
        assert s1 < 0.35 and ood.prediction is None and ood.abstained is True
        assert ood.abstain_reason == f"nearest KB chunk similarity {s1:.3f} < 0.350 (out of domain)"
        assert ind.prediction == "pets_and_animals" and ind.abstained is False
        forced = engine.infer(["How long should I boil an egg for a soft yolk?"], InferParams(k=8, abstain_threshold=0.0))[0]
        assert forced.prediction is not None  # the request's own threshold: score-only rule
    finally:
        sample_bundle.manifest = saved


def test_length_grouped_passes_equal_one_pass_and_keep_the_input_order(engine):
    texts = ["fares?", "How much does a return ticket to the island cost for a car and two adults in summer?",
             "dogs on board", "Can I bring my bicycle on the morning ferry, and is there a charge for it?",
             "lost property", "timetable in winter", "wheelchair access to the upper deck and the cafe",
             "refunds", "What happens to my booking when a sailing is cancelled because of the weather?", "pets"]
    params = [InferParams(k=k, mixing=m) for k, m in zip([8, 3, 5, 8, 2, 8, 4, 8, 6, 1], ["fixed", "joint"] * 5)]
    one = engine.infer(texts, params, group_size=0)  # one pass, all padded together
    grouped = engine.infer(texts, params, group_size=3)  # four passes, shortest texts together
    for a, b in zip(one, grouped, strict=True):
        assert [e.chunk_id for e in a.evidence] == [e.chunk_id for e in b.evidence]
        assert np.allclose(a.embedding, b.embedding, atol=1e-5, rtol=0)
        assert a.diagnostics.n_tokens == b.diagnostics.n_tokens
        assert a.diagnostics.memory_share == pytest.approx(b.diagnostics.memory_share, abs=1e-5)
    solo = engine.infer([texts[1]], params[1])[0]  # and each equals its own solo answer
    assert np.allclose(grouped[1].embedding, solo.embedding, atol=1e-5, rtol=0)


def test_a_too_long_input_in_a_grouped_batch_is_named_by_its_own_index(engine):
    from softknn.common.errors import InputTooLarge

    texts = ["a", "bb", "ccc", "dddd", "ferry " * 400, "e"]  # five passes' worth at group_size=2
    with pytest.raises(InputTooLarge) as e:
        engine.infer(texts, InferParams(truncate=False), group_size=2)
    assert e.value.field == "inputs[4]" and str(e.value).startswith("input 4 has ")


def test_spans_are_words_a_reader_can_use_never_markup(encoder, tmp_path):
    """Documentation markup (rules, tables, emphasis runs) sums its tokens' mass into one 'word';
    evidence spans offer only words holding a letter or digit, all of them when asked for all."""
    doc = ("Ferry timetable\n===============\n+-------+---------+\n| Route | Departs |\n+-------+---------+\n"
           "| Amber | 09:00   |\n**********\nBicycles ride free on the Amber Line after 7pm.")
    kb = tmp_path / "kb.jsonl"
    kb.write_text(json.dumps({"id": "timetable", "text": doc}) + "\n"
                  + json.dumps({"id": "other", "text": "Lost property is kept at the terminal for a month."}) + "\n")
    build_bundle(kb, tmp_path / "b", BuildConfig(), encoder, progress=False)
    bundle = load_bundle(tmp_path / "b")
    row = next(i for i, c in enumerate(bundle.chunks) if c["doc_id"] == "timetable")
    c = bundle.chunks[row]
    st, n = int(bundle.kv.start[row]), int(bundle.kv.count[row])
    tok = np.asarray(bundle.token_spans[st : st + n])
    merged = [(s, e) for s, e, _, _ in _word_spans(tok, np.zeros(n))]
    texts = [c["text"][s - c["start"] : e - c["start"]] for s, e in merged]
    readable = sorted(t for t in texts if any(ch.isalnum() for ch in t))
    assert len(readable) < len(texts) and "===============" in texts  # the chunk has markup runs
    (r,) = Engine(encoder, bundle).infer(["when does the amber ferry depart?"], InferParams(evidence=2, spans=MAX_SPANS))
    ev = next(e for e in r.evidence if e.doc_id == "timetable")
    assert sorted(sp.text for sp in ev.spans) == readable
    assert sum(sp.weight for sp in ev.spans) < ev.mass_share  # the markup's mass counts in the share only


def test_a_bundle_whose_calibration_chose_dense_serves_dense_by_default(engine, sample_bundle):
    saved = sample_bundle.manifest
    sample_bundle.manifest = saved.replaced(calibration={"abstain_threshold": None,
                                                         "retrieval_defaults": {"dense": {"temperature": 0.07}}})
    try:
        got = engine.infer([QUERY], InferParams(k=8))[0]
        assert (got.diagnostics.retrieval, got.diagnostics.temperature, got.diagnostics.lexical_weight) == ("dense", 0.07, None)
        own = engine.infer([QUERY], InferParams(k=8, retrieval="hybrid"))[0]  # a request's own retrieval wins
        assert (own.diagnostics.retrieval, own.diagnostics.temperature) == ("hybrid", 0.25)
        assert lexical_summary(sample_bundle.manifest)["default_retrieval"] == "dense"
    finally:
        sample_bundle.manifest = saved
    assert lexical_summary(sample_bundle.manifest)["default_retrieval"] == "hybrid"
