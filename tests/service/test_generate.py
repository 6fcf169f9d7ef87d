"""/v1/generate, /v1/chat/completions and /v1/models with the real generator (smollm2-135m-instruct)
over one small bundle (the sample KB's first 30 records) built with it: the service answers what the
core answers, streams what it answers, speaks OpenAI to the official client, frees a slot when a
client leaves mid-stream (alone, and with 16 other streams running), refuses a generation past its
queue, and answers a question the KB does not hold with the refusal text. The generator and the small
bundle are the session's (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from softknn.common.console import sample_kb_path
from softknn.generate.engine import GenEngine, GenParams, _Prepared
from softknn.generate.model import Sampling
from softknn.generate.refusal import REFUSAL_TEXT, calibrate_refusal
from softknn.index_builder.pipeline import BuildConfig, build_bundle, embed_texts
from softknn.retrieval.search import Retriever
from softknn.service.app import create_app
from softknn.storage.bundle import load_bundle
from tests.harness import threaded_server, wait_ready
from tests.service.conftest import settings_for

QUESTION = "How much is an adult single on the Amber Line?"
MESSAGES = [{"role": "user", "content": QUESTION}]
FAR = "how long should I rest a beef brisket after smoking it overnight?"  # sample_kb/ood_queries.jsonl
FAR_MESSAGES = [{"role": "user", "content": FAR}]
TOKENS = 8


@pytest.fixture(scope="module")
def ge(gen_bundle, encoder, generator) -> GenEngine:
    return GenEngine(Retriever(load_bundle(gen_bundle, expected_fingerprint=encoder.info.fingerprint)), encoder, generator)


@pytest.fixture(scope="module")
def client(gen_bundle, encoder, generator):
    with TestClient(create_app(settings_for(gen_bundle), encoder=encoder, generator=generator)) as c:
        wait_ready(c, 120)
        yield c


@pytest.fixture(scope="module")
def live(gen_bundle, encoder, generator):
    """A real uvicorn server (in a thread) with one generation slot and no queue."""
    settings = settings_for(gen_bundle, generator={"max_concurrent": 1, "max_queue": 0})
    with threaded_server(create_app(settings, encoder=encoder, generator=generator)) as c:
        yield c


def generate(c, **body) -> dict:
    r = c.post("/v1/generate", json={"max_tokens": TOKENS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def events(text: str) -> list:
    out = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    return [x if x == "[DONE]" else json.loads(x) for x in out]


def test_greedy_generate_is_the_engines_answer(client, ge):
    got = generate(client, messages=MESSAGES, k=2)
    want = ge.answer(GenParams(max_tokens=TOKENS, k=2), messages=MESSAGES)
    assert got["text"] == want.text and got["finish_reason"] == want.finish_reason
    assert [e["chunk_id"] for e in got["evidence"]] == [e.chunk_id for e in want.evidence]
    assert [t["text"] for t in got["tokens"]] == [t.text for t in want.tokens]
    assert got["usage"] == want.usage and got["generator"] == "smollm2-135m-instruct"
    assert got["bundle_version"] == ge.bundle.version and got["request_id"]
    # a prompt is one user turn (the chat template); raw: true is text the model continues
    turn = generate(client, prompt=QUESTION, k=2)
    assert turn["text"] == got["text"] and turn["usage"] == got["usage"]
    raw = generate(client, prompt="Amber Line fares:", raw=True, k=2)
    assert raw["text"] == ge.answer(GenParams(max_tokens=TOKENS, k=2), prompt="Amber Line fares:").text
    assert raw["usage"]["prompt_tokens"] == len(generator_ids(ge, "Amber Line fares:"))


def generator_ids(ge, text: str) -> list[int]:
    return ge.generator.layout(prompt=text)[1]


def test_exact_joint_is_the_masked_concatenation(client, ge, generator):
    # prior 0: the plain joint softmax, the one the contract is about
    got = generate(client, messages=MESSAGES, k=2, exact=True, mixing="joint", prior=0.0)
    prep = ge.prepare(GenParams(max_tokens=TOKENS, k=2, exact=True), None, MESSAGES)
    ref = generator.generate_masked_reference([ge.store.token_ids(r) for r in prep.rows], prep.prefix + prep.rest,
                                              "composite", Sampling(max_tokens=TOKENS), prefix_len=len(prep.prefix))
    assert got["text"] == ref.text and len(got["tokens"]) == len(ref.token_ids)
    assert got["diagnostics"]["memory_source"] == "recomputed"


def test_a_filter_limits_what_generation_draws_on(client, ge):
    from softknn.retrieval.filters import parse_filter

    flt = {"field": "label", "eq": "schedules_and_delays"}
    got = generate(client, messages=MESSAGES, k=2, filter=flt)
    want = ge.answer(GenParams(max_tokens=TOKENS, k=2, filter=parse_filter(flt)), messages=MESSAGES)
    assert got["text"] == want.text and [e["chunk_id"] for e in got["evidence"]] == [e.chunk_id for e in want.evidence]
    assert {e["label"] for e in got["evidence"]} == {"schedules_and_delays"}
    n = sum(c.get("label") == "schedules_and_delays" for c in ge.bundle.chunks)
    assert got["diagnostics"]["filtered"] == n and 2 <= n < len(ge.bundle)
    plain = generate(client, messages=MESSAGES, k=2)
    assert plain["diagnostics"]["filtered"] is None and "schedules_and_delays" not in {e["label"] for e in plain["evidence"]}
    chat = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": TOKENS, "k": 2, "filter": flt})
    assert chat.status_code == 200, chat.text
    assert [e["chunk_id"] for e in chat.json()["softknn"]["evidence"]] == [e.chunk_id for e in want.evidence]
    bad = client.post("/v1/chat/completions", json={"messages": MESSAGES, "filter": {"field": "labels", "eq": "x"}})
    assert bad.status_code == 422 and "unknown filter field 'labels'" in bad.json()["error"]["message"]


def test_fixed_alpha_one_is_the_plain_model(client):
    fixed = generate(client, messages=MESSAGES, mixing="fixed", alpha=1.0)
    plain = generate(client, messages=MESSAGES, use_kb=False)
    assert fixed["text"] == plain["text"]
    assert plain["evidence"] == [] and plain["diagnostics"]["memory_share"] == 0.0


@pytest.mark.parametrize("route,body,field", [
    ("/v1/generate", {"prompt": "x", "messages": MESSAGES}, None),
    ("/v1/generate", {"messages": MESSAGES, "raw": True}, None),
    ("/v1/generate", {}, None),
    ("/v1/generate", {"prompt": "x", "max_tokens": 513}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 513}, "max_tokens"),
])
def test_refusals_are_422_in_the_one_shape(client, route, body, field):
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "validation_error" and err["field"] == field


def test_unknown_model_is_404(client):
    r = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_stream_is_the_answer_token_by_token(client):
    whole = generate(client, messages=MESSAGES, k=2)
    r = client.post("/v1/generate", json={"messages": MESSAGES, "k": 2, "max_tokens": TOKENS, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = events(r.text)
    assert ev[-1] == "[DONE]"
    assert "".join(e["text"] for e in ev[:-2]) == whole["text"]
    assert ev[-2]["text"] == whole["text"] and ev[-2]["finish_reason"] == whole["finish_reason"]


def test_without_a_generator_the_routes_say_so(running_app, make_settings):
    with running_app(make_settings()) as c:  # the sample bundle: built without --generator
        r = c.post("/v1/generate", json={"prompt": "hello"})
        assert r.status_code == 409 and r.json()["error"]["type"] == "generator_unavailable"
        models = c.get("/v1/models")  # the embedding model alone
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["all-MiniLM-L6-v2"]
        assert c.post("/v1/infer", json={"inputs": ["hello"]}).status_code == 200


def test_the_openai_client_works_as_it_is(live):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)
    want = generate(live, messages=MESSAGES, k=2, mixing="joint")["text"]
    models = api.models.list()
    name = "smollm2-135m-instruct"
    assert [m.id for m in models.data] == ["all-MiniLM-L6-v2", name]  # the embedding model, the generator
    got = api.chat.completions.create(model=name, messages=MESSAGES, max_tokens=TOKENS,
                                      extra_body={"k": 2, "mixing": "joint"})
    assert got.choices[0].message.content == want and got.object == "chat.completion"
    assert got.usage.completion_tokens <= TOKENS and got.id.startswith("chatcmpl-")
    assert got.model_extra["softknn"]["evidence"]
    chunks = list(api.chat.completions.create(model=name, messages=MESSAGES, max_tokens=TOKENS, stream=True,
                                              stream_options={"include_usage": True},
                                              extra_body={"k": 2, "mixing": "joint"}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)


def _metric(c: httpx.Client, name: str) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_gone_mid_stream_frees_its_slot_and_overload_is_429(live):
    cancelled = 'softknn_generations_total{finish_reason="cancelled"}'
    before = _metric(live, cancelled)
    with httpx.Client(base_url=str(live.base_url), timeout=60) as other, contextlib.ExitStack() as stack:
        r = stack.enter_context(other.stream("POST", "/v1/generate", json={"messages": MESSAGES, "max_tokens": 200,
                                                                             "stream": True}))
        lines = r.iter_lines()
        seen = 0
        while seen < 2:
            seen += next(lines).startswith("data: ")
        busy = live.post("/v1/generate", json={"prompt": "hello", "max_tokens": 2})  # the one slot is taken
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "queue_full"
        assert busy.headers["Retry-After"]
    t0 = time.monotonic()  # the stream's connection is closed here
    while _metric(live, cancelled) < before + 1:
        assert time.monotonic() - t0 < 20, "the abandoned generation never stopped"
        time.sleep(0.05)
    r = live.post("/v1/generate", json={"prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 20


@pytest.fixture(scope="module")
def live17(gen_bundle, encoder, generator):
    """A real uvicorn server (in a thread) with 17 generation slots and no queue: 16 streams and one more."""
    settings = settings_for(gen_bundle, generator={"max_concurrent": 17, "max_queue": 0})
    with threaded_server(create_app(settings, encoder=encoder, generator=generator)) as c:
        yield c


# Greedy answers of these run to max_tokens on the small bundle (k 2), so every stream is still
# decoding a few steps after the one that leaves is cancelled.
LONG_QUESTIONS = [QUESTION, "How do I get a refund for a cancelled sailing?"]
LONG_TOKENS = 16


def _stream_events(base_url: str, body: dict, out: dict) -> None:
    """POST a streamed /v1/generate; out: its status and each data: event with its arrival time."""
    with httpx.Client(base_url=base_url, timeout=120) as c, c.stream("POST", "/v1/generate", json=body) as r:
        out["status"] = r.status_code
        out["events"] = [(time.monotonic(), line[len("data: "):])
                         for line in r.iter_lines() if line.startswith("data: ")]


def _until(condition, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_a_client_gone_mid_stream_frees_its_slot_while_16_other_streams_finish_their_answers(live17):
    """17 slots, no queue: one stream and 16 others hold every slot (an 18th request is 429); the one
    leaves after 2 tokens; its slot takes a new request while the 16 are still decoding, and each of
    the 16 streams its whole answer, the one it gets alone."""
    solo = {q: generate(live17, prompt=q, k=2, max_tokens=LONG_TOKENS) for q in LONG_QUESTIONS}
    assert {a["finish_reason"] for a in solo.values()} == {"length"}
    bodies = [{"prompt": q, "k": 2, "max_tokens": LONG_TOKENS, "stream": True} for q in LONG_QUESTIONS * 8]
    results: list[dict] = [{} for _ in bodies]
    threads = [threading.Thread(target=_stream_events, args=(str(live17.base_url), b, out), daemon=True)
               for b, out in zip(bodies, results, strict=True)]
    cancelled = 'softknn_generations_total{finish_reason="cancelled"}'
    before = _metric(live17, cancelled)
    with httpx.Client(base_url=str(live17.base_url), timeout=60) as other, contextlib.ExitStack() as stack:
        r = stack.enter_context(other.stream("POST", "/v1/generate", json={"prompt": QUESTION, "max_tokens": 200,
                                                                             "stream": True}))
        lines = r.iter_lines()
        seen = 0
        while seen < 2:
            seen += next(lines).startswith("data: ")
        for t in threads:
            t.start()
        _until(lambda: _metric(live17, "softknn_generations_running") == 17, 60, "the 16 streams never all ran")
        busy = live17.post("/v1/generate", json={"prompt": "hello", "max_tokens": 2})
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "queue_full" and busy.headers["Retry-After"]
    # the leaving stream's connection is closed here
    _until(lambda: _metric(live17, cancelled) >= before + 1, 20, "the abandoned generation never stopped")
    sent = time.monotonic()
    late = live17.post("/v1/generate", json={"prompt": "hello", "max_tokens": 2})  # no queue: the freed slot or 429
    assert late.status_code == 200, late.text
    for t in threads:
        t.join(120)
    for body, out in zip(bodies, results, strict=True):
        want = solo[body["prompt"]]
        assert out["status"] == 200 and out["events"][-1][1] == "[DONE]"
        tokens, answer = out["events"][:-2], json.loads(out["events"][-2][1])
        assert (answer["text"], answer["finish_reason"]) == (want["text"], "length")
        assert "".join(json.loads(e)["text"] for _, e in tokens) == want["text"] and len(tokens) == LONG_TOKENS
        assert sum(t > sent for t, _ in tokens) >= 2  # still decoding when the late request took the freed slot


def test_readme_generate_sample_is_what_the_service_answers(client):
    """The README's generate sample: its build names the generator, its server another port than the
    quick start's 8000, and its request (here over the small bundle) answers the fields its jq picks."""
    import re

    from tests.service.conftest import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("--generator smollm2-135m-instruct"):]
    block = block[: block.index("```")]
    serve = re.search(r"softknn serve --bundle bundles/sample-gen --port (\d+)", block)
    assert serve is not None and serve.group(1) != "8000"
    assert f"curl -s localhost:{serve.group(1)}/v1/generate" in block
    body = json.loads(re.search(r"-d '(\{.*?\})'", block, re.S).group(1))
    assert re.search(r"\| jq '(.*?)'", block, re.S).group(1) == "{text, evidence: [.evidence[] | .chunk_id]}"
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["text"] and len(got["evidence"]) == body["evidence"]
    assert all(e["chunk_id"] for e in got["evidence"])


# --- grounded refusal (softknn.generate.refusal) -------------------------------------------------------------
def _s1(ge, question: str) -> float:
    return ge.retrieve(question, GenParams()).nearest[0]


def test_the_build_records_a_refusal_threshold_from_its_held_out_sentences(ge, gen_bundle, encoder):
    """generator_calibrate False skips the decoded k/β grid, not the refusal threshold (retrieval only)."""
    cal = ge.store.record["calibration"]
    texts = [c["text"] for c in ge.bundle.chunks]
    want = calibrate_refusal(np.load(gen_bundle / "embeddings.npy"), texts, lambda t: embed_texts(encoder, t, 32))
    assert set(cal) == {"refusal"} and {k: v for k, v in cal["refusal"].items() if k != "seconds"} == want
    assert want["threshold"] is not None and want["questions"] >= 20 and ge.defaults()[2] == "fixed"


def test_a_question_far_from_the_kb_gets_the_refusal_text_and_the_evidence_found(client, ge):
    t = ge.store.record["calibration"]["refusal"]["threshold"]
    s1 = _s1(ge, FAR)
    assert s1 < t <= _s1(ge, QUESTION)
    got = generate(client, messages=FAR_MESSAGES, k=2)
    assert (got["text"], got["grounded"], got["finish_reason"]) == (REFUSAL_TEXT, False, "stop")
    assert got["diagnostics"]["grounding"] == {
        "grounded": False, "refused": True, "signal": "nearest_similarity", "value": pytest.approx(s1, abs=1e-6),
        "threshold": t, "note": f"nearest chunk similarity {s1:.3f} < {t:.3f}: refused"}
    d = got["diagnostics"]
    assert (d["runtime"], d["memory_source"], d["memory_tokens"], d["memory_share"], d["mixing"]) == (None, "none", 0, 0.0, None)
    retr = ge.retrieve(FAR, GenParams(k=2))
    assert [e["chunk_id"] for e in got["evidence"]] == [ge.bundle.chunks[r]["chunk_id"] for r in retr.rows[0]]
    assert "".join(x["text"] for x in got["tokens"]) == REFUSAL_TEXT
    assert got["usage"]["completion_tokens"] == len(got["tokens"]) == len(ge.generator._ids(REFUSAL_TEXT))
    chat = client.post("/v1/chat/completions", json={"messages": FAR_MESSAGES})
    assert chat.status_code == 200, chat.text
    c = chat.json()
    assert c["choices"][0]["message"]["content"] == REFUSAL_TEXT and c["choices"][0]["finish_reason"] == "stop"
    assert c["softknn"]["grounded"] is False and c["softknn"]["diagnostics"]["grounding"]["refused"] is True
    ev = events(client.post("/v1/chat/completions", json={"messages": FAR_MESSAGES, "stream": True}).text)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in ev[:-1]) == REFUSAL_TEXT
    assert ev[-2]["choices"][0]["finish_reason"] == "stop" and ev[-2]["softknn"]["grounded"] is False
    ev = events(client.post("/v1/generate", json={"messages": FAR_MESSAGES, "stream": True}).text)
    assert "".join(e["text"] for e in ev[:-2]) == REFUSAL_TEXT and ev[-2]["grounded"] is False


def test_a_refused_question_never_loads_its_chunks_keys_and_values(ge, monkeypatch):
    """The verdict needs retrieval only: R's keys/values (store reads, decoding or laying out, the LRUs) are
    loaded for answered questions, and for refuse false, not for refused ones."""
    loads = []
    real = ge.chunk_kv
    monkeypatch.setattr(ge, "chunk_kv", lambda rows, *a: loads.append(list(rows)) or real(rows, *a))
    cache = ge.decode_loop().cache
    lay = cache.layout_stored
    monkeypatch.setattr(cache, "layout_stored", lambda store, rows: loads.append(list(rows)) or lay(store, rows))
    assert ge.answer(GenParams(max_tokens=2, k=2), messages=FAR_MESSAGES).text == REFUSAL_TEXT
    assert loads == []
    ge.answer(GenParams(max_tokens=2, k=2, refuse=False), messages=FAR_MESSAGES)
    ge.answer(GenParams(max_tokens=2, k=2), messages=MESSAGES)
    assert [len(r) for r in loads] == [2, 2]


def test_an_in_kb_question_is_answered_and_grounded(client, ge):
    got = generate(client, messages=MESSAGES, k=2)
    want = ge.answer(GenParams(max_tokens=TOKENS, k=2), messages=MESSAGES)
    assert got["text"] == want.text and got["grounded"] is True and want.grounded is True
    g = got["diagnostics"]["grounding"]
    assert (g["grounded"], g["refused"], g["value"]) == (True, False, pytest.approx(_s1(ge, QUESTION), abs=1e-6))
    chat = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": TOKENS, "k": 2}).json()
    assert chat["softknn"]["grounded"] is True and chat["choices"][0]["message"]["content"] == want.text


def test_refuse_false_answers_anyway_and_still_reports_the_verdict(client, ge):
    got = generate(client, messages=FAR_MESSAGES, k=2, refuse=False)
    want = ge.answer(GenParams(max_tokens=TOKENS, k=2, refuse=False), messages=FAR_MESSAGES)
    assert got["text"] == want.text and got["text"] != REFUSAL_TEXT and got["usage"] == want.usage
    assert got["grounded"] is False and got["diagnostics"]["grounding"]["refused"] is False
    assert got["diagnostics"]["runtime"] is not None and got["diagnostics"]["memory_tokens"] > 0
    chat = client.post("/v1/chat/completions", json={"messages": FAR_MESSAGES, "max_tokens": TOKENS, "k": 2,
                                                      "refuse": False}).json()
    assert chat["choices"][0]["message"]["content"] == want.text and chat["softknn"]["grounded"] is False
    plain = generate(client, messages=FAR_MESSAGES, use_kb=False)  # no retrieval: nothing to judge
    assert plain["grounded"] is None and plain["diagnostics"]["grounding"]["note"] == "no retrieval (use_kb false): not judged"


def test_a_bundle_without_the_refusal_record_never_refuses(tmp_path, encoder, generator):
    lines = (sample_kb_path() / "kb.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    (tmp_path / "kb.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    build_bundle(tmp_path / "kb.jsonl", tmp_path / "b", BuildConfig(calibrate=False), encoder, progress=False,
                 generator=generator)
    old = GenEngine(Retriever(load_bundle(tmp_path / "b")), encoder, generator)
    assert old.store.record.get("calibration") is None
    a = old.answer(GenParams(max_tokens=4, k=2), messages=FAR_MESSAGES)
    assert a.text != REFUSAL_TEXT and a.usage["completion_tokens"] <= 4 and a.grounded is None
    g = a.diagnostics["grounding"]
    assert (g["refused"], g["threshold"], g["note"]) == (
        False, None, "the bundle was built without a refusal threshold: never refuses")


def test_a_graph_answer_lets_rs_float_copies_go_and_reports_what_it_read(ge, monkeypatch):
    """With the int8 cache the decode loop holds R as int8 from submission on: the preparation drops
    R's float K/V (what the answer reports of R stays), and the answer's diagnostics still count R's
    tokens and name the graph."""
    p = ge.resolve(GenParams(max_tokens=TOKENS, k=2))
    prep = ge.prepare(p, None, MESSAGES)
    assert prep.placed is not None and prep.placed.chunks and prep.memory_tokens > 0
    slim = prep.released()
    assert slim.placed is not None and slim.placed.chunks == [] and slim.memory_tokens == prep.memory_tokens
    assert slim.rows == prep.rows and torch.equal(slim.placed.weight, prep.placed.weight)
    calls = []
    release = _Prepared.released
    monkeypatch.setattr(_Prepared, "released", lambda self: calls.append(1) or release(self))
    got = ge.answer(GenParams(max_tokens=TOKENS, k=2), messages=MESSAGES)
    assert calls == [1]  # the answer let them go once submitted
    assert got.diagnostics["memory_tokens"] == prep.memory_tokens and got.diagnostics["runtime"].startswith("graph")


def test_a_graph_request_lays_r_out_from_the_store_as_its_float_rows_would_be(ge):
    """stream's preparation (laid=True) lays R out from the store's bytes as the decode loop's int8 columns:
    the same columns, prior and prompt layout as R's decoded float rows packed and laid out (the path of a
    chunk that moves), without the float rows; the second request's chunks come from the loop's LRU; a
    request whose chunks move (positions reordered), an exact one and the torch reference keep float rows."""
    import torch as _torch

    p = ge.resolve(GenParams(max_tokens=TOKENS, k=3))
    fast = ge.prepare(p, None, MESSAGES, laid=True)
    slow = ge.prepare(p, None, MESSAGES)
    assert fast.placed is not None and fast.placed.laid is not None and fast.placed.chunks == []
    assert slow.placed is not None and slow.placed.laid is None and len(slow.placed.chunks) == 3
    assert fast.rows == slow.rows and fast.memory_tokens == slow.memory_tokens > 0
    assert fast.memory_source == slow.memory_source == f"stored {ge.store.kind}"
    a, b = fast.packed(ge.generator, ge.layers, p.prior), slow.packed(ge.generator, ge.layers, p.prior)
    assert a.kv == [] and (a.layers, a.lengths, a.prefix_len, a.prompt_start) == (b.layers, b.lengths, b.prefix_len,
                                                                                  b.prompt_start)
    assert np.array_equal(a.bias, b.bias) and np.array_equal(a.chunk, b.chunk)
    cache = ge.decode_loop().cache
    keys, values = cache.layout(b)
    assert np.array_equal(np.concatenate([k for k, _ in fast.placed.laid], 2), keys)
    assert np.array_equal(np.concatenate([v for _, v in fast.placed.laid], 2), values)
    hits = cache.laid_hits
    again = ge.prepare(p, None, MESSAGES, laid=True)
    assert cache.laid_hits == hits + 3 and all(x is y for x, y in zip(again.placed.laid, fast.placed.laid, strict=True))
    with pytest.raises(ValueError, match="decode graph only"):
        fast.memory(ge.generator, ge.layers)
    for other in (GenParams(max_tokens=TOKENS, k=3, positions="reordered"), GenParams(max_tokens=TOKENS, k=3, exact=True),
                  GenParams(max_tokens=TOKENS, k=3, mixing="fixed", alpha=0.5)):
        prep = ge.prepare(ge.resolve(other), None, MESSAGES, laid=True)
        assert prep.placed is not None and prep.placed.laid is None and len(prep.placed.chunks) == 3, other
        assert isinstance(prep.placed.chunks[0], _torch.Tensor)


def test_retrieval_and_torch_generations_hold_the_decode_loop_off_its_lanes(ge, monkeypatch):
    """Work beside the decode loop that takes a core holds its `occupied` while it runs (a request's
    retrieval; a fixed-α generation in torch, for all of its tokens), and lets it go after: the loop's steps
    run in lanes again (tests/core/test_decode_kernel.py)."""
    loop = ge.decode_loop()
    seen: list[tuple[str, int]] = []
    prepare, generate_in_torch = ge.prepare, ge.generator.generate

    def spy_prepare(*a, **kw):
        seen.append(("retrieval", loop._occupied))
        return prepare(*a, **kw)

    def spy_generate(*a, **kw):
        for item in generate_in_torch(*a, **kw):
            seen.append(("torch", loop._occupied))
            yield item

    monkeypatch.setattr(ge, "prepare", spy_prepare)
    monkeypatch.setattr(ge.generator, "generate", spy_generate)
    ge.answer(GenParams(max_tokens=2, k=2, mixing="fixed", alpha=0.5), messages=MESSAGES)
    assert seen == [("retrieval", 1), ("torch", 1), ("torch", 1), ("torch", 1)]
    seen.clear()
    ge.answer(GenParams(max_tokens=2, k=2), messages=MESSAGES)
    assert seen == [("retrieval", 1)] and loop._occupied == 0
