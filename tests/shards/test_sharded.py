"""A sharded bundle answers exactly as the one-index bundle of the same KB (in this process)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from softknn.common.errors import BundleError
from softknn.infer.engine import Engine, InferParams
from softknn.infer.results import InferResult
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import read_manifest, verify_bundle
from softknn.storage.shards import ShardedBundle, shard_ranges
from tests.numerics import close

QUERIES = ["When does the first ferry leave on Sundays?", "Can I bring my bicycle on board?",
           "refund for a cancelled crossing", "zzz qqq"]


@pytest.fixture(scope="module")
def sharded(sharded_bundle_path, encoder):
    return load_bundle(sharded_bundle_path, expected_fingerprint=encoder.info.fingerprint)


def assert_same(a: list[InferResult | dict], b: list[InferResult | dict], tol: float = 1e-6) -> None:
    """Same evidence ids and order, same diagnostics, embeddings and similarities within `tol`
    (tests/numerics.py's rule; engine results or their JSON from the service)."""
    for ra, rb in zip(a, b, strict=True):
        ra, rb = (r.to_dict() if isinstance(r, InferResult) else r for r in (ra, rb))
        assert np.abs(np.asarray(ra["embedding"]) - np.asarray(rb["embedding"])).max() <= tol
        assert [e["chunk_id"] for e in ra["evidence"]] == [e["chunk_id"] for e in rb["evidence"]]
        for ea, eb in zip(ra["evidence"], rb["evidence"], strict=True):
            assert close(ea["similarity"], eb["similarity"], tol), (ea["similarity"], eb["similarity"])
            assert close(ea["dense_similarity"], eb["dense_similarity"], tol)
            assert ea["bm25"] == eb["bm25"]  # BM25 sliced from the global index: bit-for-bit
            assert ea["matched_terms"] == eb["matched_terms"]
            assert [s["text"] for s in ea["spans"]] == [s["text"] for s in eb["spans"]]
        da, db = dict(ra["diagnostics"]), dict(rb["diagnostics"])
        for key in da:
            if isinstance(da[key], float):
                assert close(da[key], db[key], max(tol, 1e-5)), (key, da[key], db[key])  # effective k is unbounded: relative
            else:
                assert da[key] == db[key], key
        if rb["label_scores"] is None:
            assert ra["label_scores"] is None
        else:
            assert ra["label_scores"] == pytest.approx(rb["label_scores"], abs=tol)
        assert (ra["prediction"], ra["abstained"]) == (rb["prediction"], rb["abstained"])


def test_layout(sharded_bundle_path, sample_bundle_path):
    m, one = read_manifest(sharded_bundle_path), read_manifest(sample_bundle_path)
    n = one["counts"]["chunks"]
    assert [s["rows"] for s in m["shards"]] == [list(r) for r in shard_ranges(n, 2)]
    assert m["counts"] == one["counts"] and m["calibration"] == one["calibration"]
    assert sum(read_manifest(sharded_bundle_path / s["dir"])["counts"]["chunks"] for s in m["shards"]) == n
    # every shard is an ordinary bundle, verified on its own
    for s in m["shards"]:
        assert verify_bundle(sharded_bundle_path / s["dir"])["version_id"] == s["version_id"]
    # the concatenated shards hold exactly the one-index bundle's rows
    for name in ("embeddings.npy", "mem_hidden.npy", "token_spans.npy"):  # hidden: the default memory
        whole = np.load(sample_bundle_path / name)
        parts = np.concatenate([np.load(sharded_bundle_path / s["dir"] / name) for s in m["shards"]])
        assert np.array_equal(whole, parts), name


def test_shard_ranges():
    assert shard_ranges(5, 2) == [(0, 3), (3, 5)]
    assert shard_ranges(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError):
        shard_ranges(3, 4)


def test_merge_primitives(sharded, sample_bundle, encoder):
    assert isinstance(sharded, ShardedBundle) and len(sharded) == len(sample_bundle)
    xq = encoder.forward_plain(encoder.tokenize(QUERIES)).embedding.float().numpy()
    n = len(sample_bundle)
    for k in (1, 5, n):
        for exact in (False, True):
            D1, I1 = sample_bundle.index.search(xq, k, exact=exact)
            D2, I2 = sharded.index.search(xq, k, exact=exact)
            assert np.array_equal(I1, I2), (k, exact)
            assert np.abs(D1 - D2).max() <= 1e-6
    assert np.abs(sample_bundle.index.similarities(xq).numpy() - sharded.index.similarities(xq).numpy()).max() <= 1e-6
    for q in QUERIES:
        terms = sample_bundle.lexical.analyzer.terms(q)
        assert np.array_equal(sample_bundle.lexical.scores(terms), sharded.lexical.scores(terms))  # global idf/avgdl
        for c in range(n):
            assert sample_bundle.lexical.matched(terms, c) == sharded.lexical.matched(terms, c)
    ids = [[0, n - 1, n // 2], [n // 2 - 1], []]
    w = [[0.5, 0.3, 0.2], [1.0], []]
    for bundle in (sample_bundle, sharded):  # the default memory, hidden, projects its K/V with the model
        bundle.kv.attach(encoder, encoder.check_layer(bundle.memory_layer))
    a = sample_bundle.kv.gather(ids, w, torch.device("cpu"))
    b = sharded.kv.gather(ids, w, torch.device("cpu"))
    for f in ("key", "value", "token_mask", "weight"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    for c in range(n):
        st, cnt = int(sample_bundle.kv.start[c]), int(sample_bundle.kv.count[c])
        assert (int(sharded.kv.start[c]), int(sharded.kv.count[c])) == (st, cnt)
        assert np.array_equal(sample_bundle.token_spans[st : st + cnt], sharded.token_spans[st : st + cnt])


@pytest.mark.parametrize("retrieval", ["hybrid", "dense", "lexical"])
@pytest.mark.parametrize("exact", [False, True])
def test_answers_equal_one_index(retrieval, exact, sharded, sample_bundle, encoder):
    p = InferParams(retrieval=retrieval, exact=exact)
    one = Engine(encoder, sample_bundle).infer(QUERIES, p)
    two = Engine(encoder, sharded).infer(QUERIES, p)
    assert_same(one, two)


@pytest.mark.parametrize("retrieval", ["hybrid", "lexical"])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("candidates", [5, 12, 40])
def test_shard_candidates_answer_as_one_index(retrieval, exact, candidates, sharded, sample_bundle, encoder,
                                              monkeypatch):
    """A pool m smaller than a shard: each shard sends its own dense top and BM25 top m, and the
    merged candidates give the one index's answer (exact: its brute force); no score of every
    chunk crosses when they decide it (hybrid with m > k: always here; m 5 < k 8 leaves places
    to 0-score chunks, and the brute force answers). Within 1e-4: with m 5 the normalisation's
    span d_(1) − d_(m) is small, and it scales the last bits of the dense similarities a batched
    and a one-input brute force compute differently."""
    called: list[str] = []
    backend = sharded.backend
    monkeypatch.setattr(backend, "call", lambda m, a, f=backend.call: called.append(m) or f(m, a))
    monkeypatch.setattr(backend, "call_some", lambda m, s, a, f=backend.call_some: called.append(m) or f(m, s, a))
    p = InferParams(retrieval=retrieval, exact=exact, candidates=candidates)
    one = Engine(encoder, sample_bundle).infer(QUERIES, p)
    two = Engine(encoder, sharded).infer(QUERIES, p)
    assert_same(one, two, tol=1e-4)
    assert "lexical_candidates" in called
    if retrieval == "hybrid" and candidates > p.k:
        assert not {"bm25", "similarities", "rows_dot"} & set(called), called
    if candidates == 5:
        assert "bm25" in called  # the brute force over the KB


def test_more_params_equal(sharded, sample_bundle, encoder):
    p = InferParams(k=3, threshold=0.2, mixing="joint", kernel="epanechnikov", evidence=8)
    assert_same(Engine(encoder, sample_bundle).infer(QUERIES, p), Engine(encoder, sharded).infer(QUERIES, p))


# a filter passing chunks of both shards (the sample KB's FAQ rows come first, the handbook's last)
FILTER = {"or": [{"field": "label", "in": ["pets_and_animals", "lost_property"]},
                 {"not": {"field": "metadata.source", "eq": "Support FAQ"}}]}


@pytest.mark.parametrize("retrieval", ["hybrid", "dense", "lexical"])
@pytest.mark.parametrize("path", ["exact", "scan", "selector"])
def test_filtered_answers_equal_one_index(retrieval, path, sharded, sample_bundle, encoder, monkeypatch):
    from softknn.retrieval import search
    from softknn.retrieval.filters import parse_filter

    if path == "selector":  # every filtered search through each shard's FAISS ID selector, merged
        monkeypatch.setattr(search, "FILTER_SCAN_MAX", 0)
    p = InferParams(retrieval=retrieval, exact=path == "exact", filter=parse_filter(FILTER))
    one = Engine(encoder, sample_bundle).infer(QUERIES, p)
    two = Engine(encoder, sharded).infer(QUERIES, p)
    assert_same(one, two)
    rows = [sample_bundle.row_of(e.chunk_id) for r in one for e in r.evidence]
    assert min(rows) < sharded.lo[1] <= max(rows)  # R drew on both shards
    assert {r.diagnostics.filtered for r in two} == {int(Engine(encoder, sharded).retriever.passing(p.filter).size)}


def test_verify_names_corrupt_shard_file(sharded_bundle_path, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    m = verify_bundle(copy)
    assert len(m["files"]) == 2 * (1 + len([f for f in m["files"] if f.startswith("shard-0000/")]) - 1)
    target = copy / "shard-0001" / "mem_hidden.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"shard-0001/mem_hidden\.npy: sha256 mismatch"):
        verify_bundle(copy)
    with pytest.raises(BundleError, match=r"shard-0001/mem_hidden\.npy"):
        load_bundle(copy)


def test_verify_refuses_a_swapped_shard_manifest(sharded_bundle_path, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, copy)
    mpath = copy / "manifest.json"
    m = json.loads(mpath.read_text())
    m["shards"][1]["rows"] = [0, 1]
    mpath.write_text(json.dumps(m))
    with pytest.raises(BundleError, match="version_id does not match"):
        verify_bundle(copy)


def test_a_sharded_bundle_satisfies_the_seams(sharded):
    from softknn.model.backends import ChunkSearch, MemoryStore, ShardBackend

    assert isinstance(sharded.index, ChunkSearch) and isinstance(sharded.kv, MemoryStore)
    assert isinstance(sharded.backend, ShardBackend)



def test_a_shard_opens_only_the_version_it_was_created_for(sharded_bundle_path, tmp_path):
    """A shard opened for another version of its directory (the bundle rebuilt in place) refuses to
    open; `run` answers with the version the shard holds, and a caller expecting another refuses it."""
    from softknn.common.errors import ShardMismatch
    from softknn.storage.ray_shards import RayShards
    from softknn.storage.shards import Shard

    sh = read_manifest(sharded_bundle_path)["shards"][1]
    d = sharded_bundle_path / sh["dir"]
    with pytest.raises(BundleError, match=rf"holds shard version {sh['version_id']}, but this shard was opened for "
                                          r"0123456789abcdef \(the bundle was rebuilt in place\)"):
        Shard(d, sh["rows"][0], "0123456789abcdef")
    shard = Shard(d, sh["rows"][0], sh["version_id"], verify=True)
    version, (D, I) = shard.run("search", (np.zeros((1, 384), dtype=np.float32), 3))
    assert version == sh["version_id"] and I.shape == (1, 3) and I.min() >= sh["rows"][0]
    caller = RayShards.__new__(RayShards)  # the replica's check of an answer, without actors
    caller.versions, caller.labels = [None, "0123456789abcdef"], ["shard 0 (shard-0000)", "shard 1 (shard-0001)"]
    caller._check(1, "0123456789abcdef")
    with pytest.raises(ShardMismatch, match=rf"shard 1 \(shard-0001\) holds shard version {version}, this service "
                                            "serves 0123456789abcdef"):
        caller._check(1, version)


def test_a_read_only_query_is_scored_without_a_torch_warning(sharded_bundle_path):
    """Ray hands a shard actor its query as a read-only array (from its object store): scoring it
    must not make torch warn that the array is not writable. torch warns once per process, so the
    check runs in a fresh one, warnings as errors."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import warnings, sys, numpy as np; warnings.simplefilter('error'); from softknn.storage.shards import Shard; "
            "s = Shard(sys.argv[1], 0); xq = np.ones((2, s.bundle.index.xb.shape[1]), dtype=np.float32); "
            "xq.flags.writeable = False; print(s.similarities(xq).shape)")
    r = subprocess.run([sys.executable, "-c", code, str(sharded_bundle_path / "shard-0000")], capture_output=True,
                       text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == f"(2, {read_manifest(sharded_bundle_path / 'shard-0000')['counts']['chunks']})"


def test_a_shard_s_memory_is_mapped_here_only_from_the_very_files_it_mapped(sharded_bundle_path, tmp_path):
    """map_local maps a shard's memory rows from the files the shard opened (same machine, device,
    inode, size, mtime): the same bytes; another machine's, or a file replaced since, is refused
    (None: the rows are then read through the shard)."""
    import os

    from softknn.storage.shards import Shard, host_id, map_local

    d = tmp_path / "b"
    shutil.copytree(sharded_bundle_path, d)
    shard = Shard(d / "shard-0000", 0)
    maps = shard.memory_maps()
    assert maps is not None and maps["host"] == host_id() and set(maps["arrays"]) == {"hidden"}
    hidden = shard.bundle.kv.hidden
    got = map_local(maps)
    assert got is not None and np.array_equal(got["hidden"], hidden) and got["hidden"].dtype == hidden.dtype
    assert not got["hidden"].flags.writeable
    assert map_local({**maps, "host": "another-machine"}) is None
    f = d / "shard-0000" / "mem_hidden.npy"
    shutil.copy2(f, tmp_path / "copy.npy")
    os.replace(tmp_path / "copy.npy", f)  # the same bytes and mtime in a new file: not the file the shard mapped
    assert map_local(maps) is None
    assert map_local(None) is None
