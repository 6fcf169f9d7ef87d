"""PUT/DELETE/GET /v1/documents/{doc_id} on a running server: auth like the admin routes, errors in
the one JSON shape, answers equal to a fresh build of the resulting KB, and readers that never see
two versions in one answer while writes stream in."""

from __future__ import annotations

import shutil
import threading

import pytest

from softknn.params import Settings
from softknn.service.app import create_app
from softknn.storage.writes import version_seq
from tests.builder.test_writes import fresh_build, kb_records
from tests.harness import ADMIN_TOKEN, API_KEY, threaded_server
from tests.numerics import assert_tree_close

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
QUERY = {"inputs": ["do bicycles ride free on the Amber Line after 7pm?", "lost property"], "exact": True, "evidence": 8}


@pytest.fixture()
def bundle(tmp_path, sample_bundle_path):
    out = tmp_path / "b"
    shutil.copytree(sample_bundle_path, out)
    return out


def server(bundle, encoder, *, admin: bool = True, **writes):
    auth = {"api_key": API_KEY, **({"admin_token": ADMIN_TOKEN} if admin else {})}
    settings = Settings(bundle=bundle, auth=auth, writes=writes or {"compact_after": 0}, model={"threads": 1})
    return threaded_server(create_app(settings, encoder=encoder), headers={"Authorization": f"Bearer {API_KEY}"})


def test_writes_need_the_admin_token(bundle, encoder):
    with server(bundle, encoder, admin=False) as c:
        r = c.put("/v1/documents/x", json={"text": "a"}, headers=ADMIN)
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden", r.text
        assert "no admin token is configured" in r.json()["error"]["message"]
        assert c.delete("/v1/documents/faq-0001").status_code == 403
        assert c.get("/v1/documents/faq-0001").status_code == 200  # reading takes the API key
    with server(bundle, encoder) as c:
        assert c.put("/v1/documents/x", json={"text": "a"}).status_code == 403  # the API key is not a write key
        r = c.put("/v1/documents/x", json={"text": "a"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
        assert c.get("/v1/documents/faq-0001", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert not (bundle / "writes").exists()  # nothing was written


def test_writes_through_http_answer_as_a_fresh_build(bundle, encoder, sample_kb, tmp_path):
    records = kb_records(sample_kb)
    with server(bundle, encoder) as c:
        base = c.get("/v1/index").json()["bundle_version"]
        bad = c.put("/v1/documents/x", json={"text": "   "}, headers=ADMIN)
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "kb_format_error", bad.text
        bad = c.put("/v1/documents/x", json={"label": "a"}, headers=ADMIN)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "text", bad.text
        for label in (False, 1.5, ["a"]):  # a string or an integer; a boolean is not silently the label 0 or 1
            bad = c.put("/v1/documents/x", json={"text": "a", "label": label}, headers=ADMIN)
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "label", (label, bad.text)
        options = c.options("/v1/documents/x")  # one path, three routes: the 405 names all their methods
        assert options.status_code == 405 and options.headers["allow"] == "DELETE, GET, HEAD, PUT", options.headers
        missing = c.delete("/v1/documents/nope", headers=ADMIN)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found", missing.text
        new = {"text": "Bicycles ride free on the Amber Line after 7pm, racks on the upper deck.", "label": "luggage_and_pets"}
        r = c.put("/v1/documents/bikes-2026", json=new, headers=ADMIN)
        assert r.status_code == 200, r.text
        w = r.json()
        assert (w["op"], w["seq"], w["created"], w["chunks"], w["durable"]) == ("put", 1, True, 1, True)
        assert w["bundle_version"] == f"{base}+w1"
        replaced = {"text": "Adult singles are now $10.", "label": "tickets_and_fares", "metadata": {"section": "fares"}}
        r = c.put("/v1/documents/faq-0001", json=replaced, headers=ADMIN)
        assert r.json()["created"] is False and r.json()["seq"] == 2
        handbook = next(d for d in records if d.startswith("handbook/"))
        r = c.delete(f"/v1/documents/{handbook}", headers=ADMIN)
        assert r.status_code == 200 and r.json()["seq"] == 3, r.text
        assert c.get(f"/v1/documents/{handbook}").status_code == 404
        doc = c.get("/v1/documents/faq-0001").json()
        assert doc["bundle_version"] == f"{base}+w3" and doc["document"]["text"] == replaced["text"]
        assert doc["document"]["metadata"] == {"section": "fares"} and doc["document"]["written"] is True
        got = c.post("/v1/infer", json=QUERY).json()
        assert got["bundle_version"] == f"{base}+w3"
    records = {**records, "faq-0001": replaced, "bikes-2026": new}
    records.pop(handbook)
    want = fresh_build(records, encoder, tmp_path)
    with threaded_server(create_app(Settings(bundle=want.path, model={"threads": 1}), encoder=encoder)) as c:
        fresh = c.post("/v1/infer", json=QUERY).json()
    assert_tree_close(got["results"], fresh["results"], 1e-4)
    assert any(e["chunk_id"] == "bikes-2026" for e in got["results"][0]["evidence"])
    # a restart replays the log: the same version, the same answers
    with server(bundle, encoder) as c:
        again = c.post("/v1/infer", json=QUERY).json()
        assert again["bundle_version"] == f"{base}+w3"
        assert_tree_close(again["results"], got["results"], 1e-4)
        r = c.post("/v1/admin/compact", headers=ADMIN)
        assert r.status_code == 200 and r.json()["writes_folded"] == 3 and r.json()["recalibrated"] is True, r.text
        assert version_seq(r.json()["bundle_version"]) == 3
        assert_tree_close(c.post("/v1/infer", json=QUERY).json()["results"], got["results"], 1e-4)
    # a restart on the compacted base: the version keeps its seq, and the next write follows it
    with server(bundle, encoder) as c:
        compacted = c.get("/v1/index").json()["bundle_version"]
        assert version_seq(compacted) == 3 and compacted.count("+w") == 1
        r = c.delete("/v1/documents/bikes-2026", headers=ADMIN)
        assert r.json()["bundle_version"] == compacted.replace("+w3", "+w4"), r.text


def test_readers_during_writes_never_mix_versions(bundle, encoder):
    """Writes add marker-i and delete marker-(i-2); a BM25 query for the marker word must find
    exactly the markers alive at the version the answer names, and versions only move forward."""
    ops, alive, live = [], {0: set()}, set()
    for i in range(1, 7):
        ops.append(("put", f"marker-{i}"))
        live.add(f"marker-{i}")
        alive[len(ops)] = set(live)
        if i > 2:
            ops.append(("delete", f"marker-{i - 2}"))
            live.discard(f"marker-{i - 2}")
            alive[len(ops)] = set(live)
    query = {"inputs": ["zqmarkerword"], "retrieval": "lexical", "exact": True, "k": 8, "evidence": 8}
    with server(bundle, encoder) as c:
        seen, errors, stop = [], [], threading.Event()

        def read() -> None:
            last = 0
            while not stop.is_set():
                r = c.post("/v1/infer", json=query)
                if r.status_code != 200:
                    errors.append(r.text)
                    continue
                body = r.json()
                seq = version_seq(body["bundle_version"])
                markers = {e["doc_id"] for e in body["results"][0]["evidence"] if e["doc_id"].startswith("marker-")}
                seen.append((seq, markers))
                if seq < last:
                    errors.append(f"version went back: {last} -> {seq}")
                last = seq

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        for op, doc in ops:
            if op == "put":
                r = c.put(f"/v1/documents/{doc}", json={"text": f"zqmarkerword notice {doc}"}, headers=ADMIN)
            else:
                r = c.delete(f"/v1/documents/{doc}", headers=ADMIN)
            assert r.status_code == 200, r.text
        stop.set()
        for t in readers:
            t.join(60)
    assert errors == []
    assert len({s for s, _ in seen}) >= 3, seen  # the readers did overlap the writes
    for seq, markers in seen:
        assert markers == alive[seq], (seq, markers, alive[seq])
