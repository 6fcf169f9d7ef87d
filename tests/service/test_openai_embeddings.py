"""POST /v1/embeddings through the official `openai` client, unmodified, against a real `softknn serve`
process (one per module, an API key set): the plain model's embeddings as sentence-transformers
encodes them, base64 as float32 bytes, the knowledge-augmented ones when `softknn.augmented` asks,
token usage, OpenAI's error shape, and the route counted in /metrics like /v1/infer."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.harness import API_KEY, LiveServer
from tests.numerics import close

openai = pytest.importorskip("openai")

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["Can I bring my dog on the ferry?", "What time does the first sailing leave?",
         "Bicycles travel free on every crossing, but e-bikes need a ticket."]
TOL = 1e-6


@pytest.fixture(scope="module")
def live(tmp_path_factory, bundle_dir):
    with LiveServer.start(bundle_dir, tmp_path_factory.mktemp("embeddings") / "server.log", ready_timeout=180.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0)


def assert_vectors_close(got, want, tol: float = TOL) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    worst = int(np.argmax(np.abs(got - want)))
    assert all(close(float(a), float(b), tol) for a, b in zip(got.ravel(), want.ravel())), \
        (worst, got.ravel()[worst], want.ravel()[worst])


def test_plain_embeddings_are_sentence_transformers_encode(api, encoder):
    assert [m.id for m in api.models.list().data] == [MODEL]
    want = encoder.st.encode(TEXTS)  # (3, 384), the model's Normalize module included
    default = api.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    as_float = api.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float", user="someone")
    for r in (default, as_float):
        assert r.model == MODEL and [d.index for d in r.data] == [0, 1, 2]
        assert_vectors_close([d.embedding for d in r.data], want)
    one = api.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=384)
    assert len(one.data) == 1
    assert_vectors_close(one.data[0].embedding, want[0])
    n = sum(len(encoder.tokenizer(t)["input_ids"]) for t in TEXTS)  # [CLS] … [SEP] included
    assert (as_float.usage.prompt_tokens, as_float.usage.total_tokens) == (n, n)


def test_base64_is_the_float32_bytes_of_the_float_answer(live):
    body = {"model": MODEL, "input": TEXTS}
    floats = live.client.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    b64 = live.client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    for f, b in zip(floats["data"], b64["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.asarray(f["embedding"], dtype=np.float32).tolist()
    assert floats["softknn"]["augmented"] is False and floats["softknn"]["bundle_version"] is None


def test_plain_equals_infer_at_alpha_one_and_augmented_equals_infer(api, live):
    plain = api.embeddings.create(model=MODEL, input=TEXTS)
    r = live.client.post("/v1/infer", json={"inputs": TEXTS, "alpha": 1.0})
    assert r.status_code == 200, r.text
    assert_vectors_close([d.embedding for d in plain.data], [x["embedding"] for x in r.json()["results"]])

    opts = {"augmented": True, "k": 4, "alpha": 0.5, "retrieval": "hybrid"}
    aug = api.embeddings.create(model=MODEL, input=TEXTS, extra_body={"softknn": opts})
    r = live.client.post("/v1/infer", json={"inputs": TEXTS, "k": 4, "alpha": 0.5, "retrieval": "hybrid"})
    infer = r.json()
    assert_vectors_close([d.embedding for d in aug.data], [x["embedding"] for x in infer["results"]])
    # it is not the plain embedding: the KB moved it
    assert np.abs(np.asarray(aug.data[0].embedding) - np.asarray(plain.data[0].embedding)).max() > 1e-3
    extra = aug.model_extra["softknn"]
    assert extra["augmented"] is True and extra["bundle_version"] == infer["bundle_version"]


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    e = info.value
    return e.status_code, e.body


def test_errors_are_openai_shaped_and_exact(api, live):
    status, body = error_of(lambda: api.embeddings.create(model="text-embedding-3-small", input=TEXTS))
    assert status == 404
    assert body == {"type": "model_not_found", "code": "model_not_found", "param": "model", "field": "model",
                    "message": "model 'text-embedding-3-small' is not an embedding model served here; "
                               "GET /v1/models lists 'all-MiniLM-L6-v2'"}
    status, body = error_of(lambda: api.embeddings.create(model=MODEL, input=TEXTS, dimensions=256))
    assert (status, body["code"], body["param"]) == (422, "invalid_input", "dimensions")
    assert body["message"] == ("dimensions=256 is not supported: all-MiniLM-L6-v2 embeddings have 384 dimensions "
                               "(send 384 or leave it out)")
    for tokens in ([101, 2054, 102], [[101, 2054, 102], [101, 102]]):
        status, body = error_of(lambda tokens=tokens: api.embeddings.create(model=MODEL, input=tokens))
        assert (status, body["code"], body["param"]) == (422, "invalid_input", "input")
        assert body["message"].startswith("token-id input (arrays of integers) is not supported")
    status, body = error_of(lambda: api.embeddings.create(model=MODEL, input=[]))
    assert (status, body["code"], body["param"]) == (422, "invalid_input", "input")
    status, body = error_of(lambda: api.embeddings.create(model=MODEL, input=["fine", "  "]))
    assert (status, body["code"], body["param"]) == (422, "invalid_input", "input[1]")
    status, body = error_of(lambda: api.embeddings.create(model=MODEL, input="x", extra_body={"softknn": {"k": 3}}))
    assert (status, body["code"], body["param"]) == (422, "invalid_input", "softknn.k")
    long = " ".join(["ferry"] * 400)  # under the character limit, over the model's 256 tokens
    status, body = error_of(lambda: api.embeddings.create(model=MODEL, input=["short", long]))
    assert (status, body["code"], body["param"]) == (413, "input_too_large", "input[1]")
    assert body["message"] == "input[1] has 402 tokens, more than the limit 256; send softknn.truncate=true to cut it"
    cut = api.embeddings.create(model=MODEL, input=[long], extra_body={"softknn": {"truncate": True}})
    assert cut.usage.prompt_tokens == 256
    wrong = openai.OpenAI(base_url=f"{live.url}/v1", api_key="not-the-key", max_retries=0)
    status, body = error_of(lambda: wrong.embeddings.create(model=MODEL, input=TEXTS))
    assert (status, body["code"]) == (401, "unauthorized")


def test_counted_and_batched_like_infer(live):
    before = live.metric("softknn_http_requests_total", route="/v1/embeddings", method="POST", status="200")
    texts_before = live.metric("softknn_batch_size_sum")
    for _ in range(3):
        assert live.client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
    assert live.metric("softknn_http_requests_total", route="/v1/embeddings", method="POST", status="200") == before + 3
    assert live.metric("softknn_batch_size_sum") == texts_before + 3 * len(TEXTS)  # through the batcher


def test_usage_doc_sample_is_what_the_client_prints(api):
    from tests.service.conftest import REPO

    readme = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    text = "Can I bring my dog on the ferry?"
    r = api.embeddings.create(model=MODEL, input=[text])
    assert f"# {len(r.data[0].embedding)} {[round(x, 4) for x in r.data[0].embedding[:3]]} {r.usage.prompt_tokens}\n" \
        in readme
    aug = api.embeddings.create(model=MODEL, input=[text], extra_body={"softknn": {"augmented": True, "k": 4}})
    assert f"the KB moved it: {[round(x, 4) for x in aug.data[0].embedding[:3]]}\n" in readme
