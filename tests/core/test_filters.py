"""Filters: the filter language and its refusals, the vectorised mask against the chunk-by-chunk
reference, R under a filter equal to the answer of a bundle built from the passing chunks alone
(BM25 with the whole KB's statistics, docs/design.md "Filters"), and the index-restricted fast
path against the brute force over the passing chunks."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from softknn.cli import sample_kb_path
from softknn.common.errors import InvalidInput
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.engine import Engine, InferParams
from softknn.retrieval import chunk_index, search
from softknn.retrieval.chunk_index import ChunkIndex, IndexSpec, build_index
from softknn.retrieval.filters import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_VALUES,
    ChunkTable,
    filter_json,
    mask_reference,
    parse_filter,
)
from softknn.storage.bundle import load_bundle
from tests.numerics import assert_tree_close

QUERIES = ["Can I bring my dog on the ferry?", "refund for a cancelled sailing", "wheelchair access at the pier",
           "how much is an adult single ticket", "zzzz qqqq"]
TOL = 1e-5


# --- the language and its refusals ------------------------------------------------------------------
def test_a_filter_round_trips_as_json():
    f = {"and": [{"field": "doc_id", "in": ["a", "b"]},
                 {"or": [{"field": "label", "eq": "pets"}, {"not": {"field": "metadata.year", "gte": 2020.0, "lt": 2024.0}}]},
                 {"field": "metadata.source.kind", "eq": True}]}
    assert filter_json(parse_filter(f)) == f


@pytest.mark.parametrize("bad,says", [
    ({"field": "title", "eq": "x"}, "unknown filter field 'title'"),
    ({"field": "metadata", "eq": "x"}, "unknown filter field 'metadata'"),
    ({"field": "label"}, "exactly one of"),
    ({"field": "label", "eq": "x", "in": ["y"]}, "exactly one of"),
    ({"field": "label", "eq": "x", "gt": 1}, "exactly one of"),
    ({"field": "label", "eq": ["x"]}, "valid string"),
    ({"field": "metadata.year", "gt": "2020"}, "valid number"),
    ({"field": "metadata.year", "gt": True}, "valid number"),
    ({"field": "label", "in": []}, "at least 1 item"),
    ({"and": []}, "at least 1 item"),
    ({"and": [{"field": "label", "eq": "x"}], "or": []}, "Extra inputs"),
    ({"field": "label", "eq": "x", "neq": "y"}, "Extra inputs"),
    ({"xor": []}, "a filter is"),
    ([{"field": "label", "eq": "x"}], "a filter is"),
])
def test_a_bad_filter_is_refused_naming_the_problem(bad, says):
    with pytest.raises(InvalidInput) as e:
        parse_filter(bad)
    assert says in e.value.message and e.value.field == "filter"


def test_too_deep_too_many_objects_or_values_are_refused():
    leaf: dict = {"field": "label", "eq": "x"}
    deep = leaf
    for _ in range(MAX_DEPTH - 1):
        deep = {"not": deep}
    parse_filter(deep)  # MAX_DEPTH levels: accepted
    with pytest.raises(InvalidInput, match=f"deeper than {MAX_DEPTH}"):
        parse_filter({"not": deep})
    with pytest.raises(InvalidInput, match=f"more than {MAX_NODES}"):
        parse_filter({"or": [leaf] * MAX_NODES})
    parse_filter({"or": [leaf] * (MAX_NODES - 1)})
    with pytest.raises(InvalidInput, match=f"more than {MAX_VALUES} values"):
        parse_filter({"or": [{"field": "doc_id", "in": ["a"] * (MAX_VALUES // 2 + 1)}] * 2})
    hostile: dict = leaf
    for _ in range(10_000):  # far past the recursion limit: refused by the size check, no RecursionError
        hostile = {"not": hostile}
    with pytest.raises(InvalidInput, match="deeper"):
        parse_filter(hostile)


# --- the mask ---------------------------------------------------------------------------------------
CHUNKS = [
    {"chunk_id": "a#0", "doc_id": "a", "label": "pets", "metadata": {"year": 2019, "tier": "gold", "ok": True}},
    {"chunk_id": "a#1", "doc_id": "a", "label": "pets", "metadata": {"year": 2019, "tier": "gold", "ok": True}},
    {"chunk_id": "b", "doc_id": "b", "label": None, "metadata": {"year": 2021.5, "tier": 1, "src": {"kind": "faq"}}},
    {"chunk_id": "c", "doc_id": "c", "label": "fares", "metadata": {"year": "2020", "tier": "1", "ok": 1}},
    {"chunk_id": "d", "doc_id": "d", "label": "fares", "metadata": {"tags": ["x", "y"], "year": None}},
    {"chunk_id": "e", "doc_id": "e", "label": "weather", "metadata": {"year": 2024, "ok": False, "src": {"kind": "web"}}},
]


@pytest.mark.parametrize("f,rows", [
    ({"field": "doc_id", "eq": "a"}, [0, 1]),
    ({"field": "chunk_id", "in": ["b", "e", "nope"]}, [2, 5]),
    ({"field": "label", "in": ["fares", "weather"]}, [3, 4, 5]),
    ({"not": {"field": "label", "eq": "pets"}}, [2, 3, 4, 5]),  # no label: not "pets"
    ({"field": "metadata.year", "gte": 2019, "lt": 2022}, [0, 1, 2]),  # "2020" is a string: no number
    ({"field": "metadata.year", "eq": 2019.0}, [0, 1]),  # 2019 = 2019.0
    ({"field": "metadata.year", "eq": "2020"}, [3]),
    ({"field": "metadata.tier", "eq": 1}, [2]),  # 1 ≠ "1"
    ({"field": "metadata.ok", "eq": True}, [0, 1]),  # true ≠ 1
    ({"field": "metadata.ok", "eq": 1}, [3]),
    ({"field": "metadata.src.kind", "eq": "faq"}, [2]),
    ({"field": "metadata.tags", "eq": "x"}, []),  # a list is not a comparable value
    ({"field": "label", "eq": "nope"}, []),
    ({"or": [{"field": "doc_id", "eq": "e"}, {"and": [{"field": "label", "eq": "pets"},
                                                      {"not": {"field": "chunk_id", "eq": "a#1"}}]}]}, [0, 5]),
])
def test_the_mask_selects_exactly_these_chunks(f, rows):
    flt = parse_filter(f)
    got = ChunkTable.of(CHUNKS).mask(flt)
    assert np.flatnonzero(got).tolist() == rows
    assert np.array_equal(mask_reference(CHUNKS, flt), got)


def test_numbers_past_float_range_are_refused_in_a_filter_and_not_comparable_in_a_chunk():
    with pytest.raises(InvalidInput):
        parse_filter({"field": "metadata.year", "eq": 10**400})
    table = ChunkTable.of([*CHUNKS, {"chunk_id": "f", "doc_id": "f", "metadata": {"year": 10**400}}])
    assert np.flatnonzero(table.mask(parse_filter({"field": "metadata.year", "gt": 2023}))).tolist() == [5]


def test_an_unknown_metadata_field_or_a_range_on_strings_is_refused():
    table = ChunkTable.of(CHUNKS)
    with pytest.raises(InvalidInput, match="'metadata.yeer': no chunk of this KB has it; its metadata fields are "
                                           "metadata.ok, metadata.src.kind, metadata.tags, metadata.tier, metadata.year"):
        table.mask(parse_filter({"field": "metadata.yeer", "eq": 1}))
    with pytest.raises(InvalidInput, match="'label' holds no numbers"):
        table.mask(parse_filter({"field": "label", "gt": 1}))


def _random_filter(rng: random.Random, depth: int = 0) -> dict:
    if depth < 3 and rng.random() < 0.5:
        op = rng.choice(["and", "or", "not"])
        if op == "not":
            return {"not": _random_filter(rng, depth + 1)}
        return {op: [_random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    field = rng.choice(["doc_id", "label", "metadata.year", "metadata.tier", "metadata.ok"])
    values = ["a", "b", "pets", "fares", 2019, 2021.5, 1, "1", True, False, "gold"]
    r = rng.random()
    if r < 0.3:
        return {"field": field, "eq": rng.choice(values)}
    if r < 0.6:
        return {"field": field, "in": rng.sample(values, 3)}
    return {"field": "metadata.year", rng.choice(["gt", "gte"]): rng.choice([2018, 2019, 2021.5]),
            rng.choice(["lt", "lte"]): rng.choice([2019, 2022, 2030])}


def test_the_vectorised_mask_equals_the_reference_on_random_filters():
    chunks = CHUNKS * 50
    table = ChunkTable.of(chunks)
    rng = random.Random(7)
    seen = set()
    for _ in range(300):
        f = parse_filter(_random_filter(rng))
        got = table.mask(f)
        assert np.array_equal(got, mask_reference(chunks, f)), filter_json(f)
        seen.add(tuple(got[: len(CHUNKS)]))
    assert len(seen) > 10  # the filters select many different subsets of the 6 chunks, not all or nothing


# --- R under a filter = the answer of a bundle of the passing chunks --------------------------------
def _records() -> list[dict]:
    lines = (sample_kb_path() / "kb.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(line) for line in lines if line.strip()][::4][:60]  # every label, 60 records
    for i, r in enumerate(recs):
        r["metadata"] = {**r.get("metadata", {}), "year": 2000 + i % 25, "region": ["north", "south", "east"][i % 3]}
    return recs


FILTER = {"and": [{"field": "metadata.year", "gte": 2005}, {"not": {"field": "metadata.region", "eq": "east"}}]}


@pytest.fixture(scope="module")
def kb_pair(tmp_path_factory, encoder):
    """(full bundle, bundle of FILTER's records alone, the passing rows of the full one), both built
    by the real builder from the same records in the same order."""
    root = tmp_path_factory.mktemp("filtered_kb")
    recs = _records()
    keep = [r for i, r in enumerate(recs) if r["metadata"]["year"] >= 2005 and r["metadata"]["region"] != "east"]
    for name, rs in (("full", recs), ("part", keep)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs), encoding="utf-8")
        build_bundle(root / f"{name}.jsonl", root / name, BuildConfig(), encoder, progress=False)
    full, part = (load_bundle(root / n, expected_fingerprint=encoder.info.fingerprint) for n in ("full", "part"))
    rows = np.flatnonzero(ChunkTable.of(full.chunks).mask(parse_filter(FILTER)))
    assert [c["chunk_id"] for c in part.chunks] == [full.chunks[r]["chunk_id"] for r in rows]
    assert 0 < len(rows) < len(full)
    return full, part, rows


class GlobalBM25:
    """The part bundle's lexical index with the full KB's BM25: scores sliced to the passing rows."""

    def __init__(self, full, rows):
        self.full, self.rows = full.lexical, rows
        self.analyzer, self.spec, self.n = self.full.analyzer, self.full.spec, len(rows)

    def __len__(self) -> int:
        return self.n

    def scores(self, terms):
        return self.full.scores(terms)[self.rows]

    def matched(self, terms, c):
        return self.full.matched(terms, int(self.rows[c]))

    def matched_rows(self, terms, rows):
        return self.full.matched_rows(terms, [int(self.rows[c]) for c in rows])


def _params(**kw) -> InferParams:
    # the two bundles are calibrated on different chunks: τ, λ and the abstain rule are pinned
    return InferParams(temperature=0.1, lexical_weight=0.5, abstain_threshold=0.3, evidence=8, **kw)


def _compare(got, want, n_part: int) -> None:
    for g, w in zip(got, want, strict=True):
        dg, dw = g.to_dict(), w.to_dict()
        assert dg["diagnostics"]["filtered"] == n_part and dw["diagnostics"]["filtered"] is None
        dg["diagnostics"]["filtered"] = None
        assert_tree_close(dg, dw, TOL)


@pytest.mark.parametrize("exact", [True, False])
def test_dense_answer_equals_the_bundle_of_the_passing_chunks(kb_pair, encoder, exact):
    full, part, rows = kb_pair
    p = _params(retrieval="dense", exact=exact, return_tokens=True)
    got = Engine(encoder, full).infer(QUERIES, replace(p, filter=parse_filter(FILTER)))
    want = Engine(encoder, part).infer(QUERIES, p)
    _compare(got, want, len(rows))
    assert {e.chunk_id for r in got for e in r.evidence} <= {c["chunk_id"] for c in part.chunks}


@pytest.mark.parametrize("retrieval", ["hybrid", "lexical"])
@pytest.mark.parametrize("exact", [True, False])
def test_hybrid_answer_equals_the_passing_chunks_with_global_bm25(kb_pair, encoder, retrieval, exact):
    full, part, rows = kb_pair
    p = _params(retrieval=retrieval, exact=exact)
    got = Engine(encoder, full).infer(QUERIES, replace(p, filter=parse_filter(FILTER)))
    want = Engine(encoder, replace(part, lexical=GlobalBM25(full, rows))).infer(QUERIES, p)
    _compare(got, want, len(rows))
    # the statistics are the whole KB's: each chunk's BM25 is its unfiltered score, not the part bundle's own
    differs = 0
    for q, r in zip(QUERIES, got, strict=True):
        terms = full.lexical.analyzer.terms(q)
        b_full, b_part = full.lexical.scores(terms), part.lexical.scores(terms)
        for e in r.evidence:
            assert e.bm25 == pytest.approx(float(b_full[full.row_of(e.chunk_id)]), rel=1e-6)
            differs += e.bm25 != pytest.approx(float(b_part[part.row_of(e.chunk_id)]), rel=1e-3)
    assert differs > 0


def test_a_filter_nothing_passes_leaves_r_empty(kb_pair, encoder):
    full, _, _ = kb_pair
    r = Engine(encoder, full).infer(QUERIES[:1], _params(filter=parse_filter({"field": "doc_id", "eq": "none"})))[0]
    assert r.evidence == [] and r.diagnostics.retrieved == 0 and r.diagnostics.filtered == 0
    assert r.diagnostics.memory_share == 0.0 and r.abstained and r.abstain_reason == "no labelled chunk in R"


def test_unknown_metadata_field_in_a_request_is_invalid_input(kb_pair, encoder):
    full, _, _ = kb_pair
    with pytest.raises(InvalidInput, match="metadata.region, metadata.section, metadata.source, metadata.year"):
        Engine(encoder, full).infer(QUERIES[:1], _params(filter=parse_filter({"field": "metadata.yr", "gt": 1})))


# --- the fast path against the brute force over the passing chunks ----------------------------------
FILTERS = [{"field": "metadata.year", "gte": 2010}, {"field": "metadata.region", "in": ["north", "south"]},
           {"field": "label", "eq": "pets_and_animals"}, {"not": {"field": "metadata.year", "lt": 2003}}]


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize("retrieval", ["dense", "hybrid", "lexical"])
def test_index_restricted_search_equals_the_brute_force(kb_pair, encoder, monkeypatch, kind, retrieval):
    full = kb_pair[0]
    if kind == "hnsw":  # the same chunks behind an HNSW index (efSearch ≥ N: the graph finds every passing chunk)
        spec = IndexSpec("hnsw", {"M": 16, "efConstruction": 80, "efSearch": 256})
        xb = np.asarray(full.index.xb)
        full = replace(full, index=ChunkIndex(build_index(xb, spec), xb, spec))
    monkeypatch.setattr(search, "FILTER_SCAN_MAX", 0)  # every filtered search through the index's ID selector
    monkeypatch.setattr(search, "FILTER_INDEX_SHARE", 0.0)
    eng = Engine(encoder, full)
    for f in FILTERS:
        p = _params(retrieval=retrieval, filter=parse_filter(f), k=5)
        xq = eng.encoder.forward_plain(eng.encoder.tokenize(QUERIES)).embedding.float().numpy()
        fast = eng.retrieve(xq, eng.resolve([p] * len(QUERIES)), QUERIES)
        brute = eng.retrieve(xq, eng.resolve([replace(p, exact=True)] * len(QUERIES)), QUERIES)
        assert fast.searched[0] == ("exact" if kind == "flat" else "hnsw") and brute.searched[0] == "exact"
        assert fast.rows == brute.rows, f
        assert_tree_close([fast.scores, fast.weights, fast.dense, fast.nearest, fast.bound],
                          [brute.scores, brute.weights, brute.dense, brute.nearest, brute.bound], TOL)
        assert fast.filtered == brute.filtered == [int(ChunkTable.of(full.chunks).mask(p.filter).sum())] * len(QUERIES)


def test_search_among_on_flat_breaks_ties_by_row():
    xb = np.zeros((40, 4), dtype=np.float32)
    xb[:, 0] = 1.0  # every chunk scores the same
    spec = IndexSpec("flat", {})
    idx = ChunkIndex(build_index(xb, spec), xb, spec)
    rows = np.array([3, 7, 8, 20, 21, 39])
    D, I = idx.search_among(np.array([[1, 0, 0, 0]], dtype=np.float32), 3, rows)
    assert I.tolist() == [[3, 7, 8]] and D.tolist() == [[1.0, 1.0, 1.0]]
    assert idx.search_among(np.array([[1, 0, 0, 0]], dtype=np.float32), 10, rows)[1].tolist() == [rows.tolist()]


# --- the CLI ------------------------------------------------------------------------------------------
def test_cli_query_filter(sample_bundle_path):
    from typer.testing import CliRunner

    from softknn.cli import app

    flt = json.dumps({"field": "label", "eq": "lost_property"})
    r = CliRunner().invoke(app, ["query", str(sample_bundle_path), "Can I bring my dog?", "--json", "--k", "3",
                                 "--filter", flt])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)["results"][0]
    assert [e["label"] for e in res["evidence"]] == ["lost_property"] * 3 and res["diagnostics"]["filtered"] == 21
    assert res["abstained"]  # the nearest chunk that passes is far from a question about dogs
    for bad, says in (("{label: 1}", "--filter: not JSON"), ('{"field": "title", "eq": 1}', "unknown filter field 'title'")):
        r = CliRunner().invoke(app, ["query", str(sample_bundle_path), "dog", "--filter", bad])
        assert r.exit_code == 2 and says in r.output, r.output


def test_an_ivf_search_short_of_passing_chunks_answers_with_those_it_found(kb_pair, encoder, monkeypatch):

    full = kb_pair[0]
    xb = np.asarray(full.index.xb)
    spec = IndexSpec("ivf", {"nlist": 4, "nprobe": 1})
    ivf = ChunkIndex(build_index(xb, spec), xb, spec)
    lists = ivf.index.quantizer.search(xb, 1)[1][:, 0]  # type: ignore[attr-defined]  # each chunk's list
    a = 0
    b = int(np.flatnonzero(lists != lists[a])[0])  # a passing chunk in another list than the query's
    monkeypatch.setattr(search, "FILTER_SCAN_MAX", 0)
    monkeypatch.setattr(search, "FILTER_INDEX_SHARE", 0.0)
    monkeypatch.setattr(chunk_index, "FILTER_WIDEN", 1.0)  # one list probed: b is never seen
    eng = Engine(encoder, replace(full, index=ivf))
    f = parse_filter({"field": "chunk_id", "in": [full.chunks[a]["chunk_id"], full.chunks[b]["chunk_id"]]})
    p = eng.resolve([_params(retrieval="dense", k=2, filter=f)])
    r = eng.retrieve(xb[a : a + 1], p)
    assert r.rows == [[a]] and r.filtered == [2] and r.searched == ["ivf"]
    assert r.nearest[0] == pytest.approx(float(xb[a] @ xb[a]), abs=1e-5)
    only_b = eng.resolve([_params(retrieval="dense", k=2, filter=parse_filter(
        {"field": "chunk_id", "eq": full.chunks[b]["chunk_id"]}))])
    r = eng.retrieve(xb[a : a + 1], only_b)  # nothing found: R empty, no similarity made up
    assert r.rows == [[]] and r.nearest == [-1.0] and r.filtered == [1]
    monkeypatch.setattr(chunk_index, "FILTER_WIDEN", 16.0)  # widened by N/|P|: every list probed, both found
    assert sorted(eng.retrieve(xb[a : a + 1], p).rows[0]) == sorted([a, b])
