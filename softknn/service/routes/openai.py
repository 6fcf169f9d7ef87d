"""OpenAI-compatible routes: POST /v1/chat/completions (chat.completion, or chat.completion.chunk
events with `stream`), POST /v1/embeddings (the plain model's embeddings, or the knowledge-augmented
ones when `softknn.augmented` asks) and GET /v1/models (the embedding model and the served
generator). softknn's chat parameters (k, mixing, alpha, use_kb, ...) are extra top-level fields,
its embedding parameters one `softknn` object: what the openai client's `extra_body` sends.
Errors carry OpenAI's `param` and `code` next to the service's `type`, `message`, `field`."""

# No `from __future__ import annotations`: FastAPI must see the body model class itself (deps.body_model).

import base64
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
from fastapi import APIRouter

from softknn.common.errors import InvalidInput
from softknn.common.table import InferParams, merge_aliases
from softknn.generate.engine import GenAnswer
from softknn.generate.model import Step
from softknn.params import gen_params, infer_params
from softknn.service.auth import ReaderDep
from softknn.service.deps import KBQuery, KBsDep, RequestIdDep, SettingsDep, body_model
from softknn.service.errors import ModelNotFound
from softknn.service.responses import FastJSONResponse, event_stream, first_item, sse
from softknn.service.schemas import (
    ChatBody,
    ChatCompletion,
    ChatRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    ModelList,
)

ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 422, 429, 503)}


def finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"  # cancelled: nobody reads it


def extra(request_id: str, answer: GenAnswer) -> dict:
    d = answer.to_dict()
    return {"request_id": request_id, "bundle_version": answer.bundle_version, "grounded": answer.grounded,
            "evidence": d["evidence"],
            "diagnostics": d["diagnostics"], "tokens": d["tokens"]}


def encode(vector: np.ndarray | list[float], encoding_format: str) -> list[float] | str:
    """One embedding as OpenAI sends it: numbers, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist() if isinstance(vector, np.ndarray) else vector


router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", response_model=ModelList, responses={s: {"model": ErrorResponse} for s in (401, 404, 422, 503)},
            summary="OpenAI-compatible: the embedding model, and the served generator if any")
async def models(kbs: KBsDep, who: ReaderDep, kb: KBQuery = None) -> dict:
    """The generator listed is the one of the KB `kb` names (or the default KB)."""
    runtime = kbs.pick(kb, who)
    engine = runtime.current()
    data = [{"id": engine.encoder.info.name, "object": "model", "created": runtime.model_created,
             "owned_by": "softknn"}]
    ge = runtime.generation.served
    if ge is not None:
        data.append({"id": ge.generator.info.name, "object": "model", "created": runtime.generation.created,
                     "owned_by": "softknn"})
    return {"object": "list", "data": data}


@router.post("/embeddings", response_model=EmbeddingResponse, responses=ERRORS,
             summary="OpenAI-compatible embeddings: the plain model's, or knowledge-augmented (softknn.augmented)")
async def embeddings(body: EmbeddingRequest, kbs: KBsDep, who: ReaderDep, settings: SettingsDep,
                     request_id: RequestIdDep) -> FastJSONResponse:
    """`model` must be the embedding model's id (GET /v1/models) or empty: else 404 model_not_found.
    The plain embedding is the sentence-transformers model's own output (pooled, normalised);
    with `softknn: {"augmented": true, ...}` it is /v1/infer's knowledge-augmented `embedding`
    with those parameters (k, alpha, mixing, retrieval, ...) over the KB `kb` names."""
    runtime = kbs.pick(body.kb, who)
    engine = runtime.current()
    info = engine.encoder.info
    if body.model and body.model != info.name:
        raise ModelNotFound(f"model {body.model!r} is not an embedding model served here; GET /v1/models lists "
                            f"{info.name!r}", field="model")
    if body.dimensions is not None and body.dimensions != info.dim:
        raise InvalidInput(f"dimensions={body.dimensions} is not supported: {info.name} embeddings have "
                           f"{info.dim} dimensions (send {info.dim} or leave it out)", field="dimensions")
    texts = body.texts
    field = "input[{i}]" if isinstance(body.input, list) else "input"
    if body.augmented:  # no evidence: only the embedding is returned
        given = merge_aliases(InferParams, body.given(), where="softknn.")
        params = replace(infer_params(settings, given), evidence=0, spans=0)
        engine, results = await runtime.infer(texts, [params] * len(texts), truncate=params.truncate,
                                              request_id=request_id, field=field,
                                              hint="send softknn.truncate=true to cut it")
        vectors: list = [r.embedding for r in results]
        tokens = [r.diagnostics.n_tokens for r in results]
    else:
        engine, vectors, tokens = await runtime.embed(texts, truncate=body.truncate, request_id=request_id,
                                                      field=field, hint="send softknn.truncate=true to cut it")
    augmented = body.augmented
    n = sum(tokens)
    return FastJSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": info.name, "usage": {"prompt_tokens": n, "total_tokens": n},
        "softknn": {"request_id": request_id, "augmented": augmented,
                    "bundle_version": engine.bundle.version if augmented else None}})


@router.post("/chat/completions", response_model=ChatCompletion, responses={
    **ERRORS, 200: {"content": {"text/event-stream": {"schema": {"type": "string", "description":
                    "stream: `chat.completion.chunk` events (first delta {role: assistant}, then content deltas, "
                    "then one with finish_reason and a `softknn` field, then usage when "
                    "stream_options.include_usage), then `data: [DONE]`"}}}}},
             summary="OpenAI-compatible chat completion with the KB in the generator's attention")
@body_model(ChatRequest)
async def chat_completions(body: ChatBody, kbs: KBsDep, who: ReaderDep, settings: SettingsDep,
                           request_id: RequestIdDep):
    """`model` must be the served generator's id (or empty): else 404 model_not_found. n = 1 only.
    temperature defaults to 0 (greedy), not OpenAI's 1."""
    runtime = kbs.pick(body.kb, who)
    ge = runtime.generation.current()
    name = ge.generator.info.name
    if body.model and body.model != name:
        raise ModelNotFound(f"model {body.model!r} is not served here; GET /v1/models lists {name!r}",
                            field="model")
    params = gen_params(settings, body.given())
    messages = [m.plain() for m in body.messages]
    cid, created = f"chatcmpl-{request_id}", int(time.time())
    if not body.stream:
        a = await runtime.generation.answer(ge, params, None, messages, request_id=request_id)
        return FastJSONResponse({
            "id": cid, "object": "chat.completion", "created": created, "model": name,
            "system_fingerprint": a.bundle_version,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": a.text},
                         "finish_reason": finish(a.finish_reason), "logprobs": None}],
            "usage": a.usage, "softknn": extra(request_id, a)})
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    stream = runtime.generation.generate(ge, params, None, messages, request_id=request_id)
    first = await first_item(stream)

    def chunk(delta: dict, reason: str | None = None, **more) -> bytes:
        out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
               "system_fingerprint": ge.bundle.version,
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}], **more}
        if include_usage:
            out.setdefault("usage", None)
        return sse(out)

    async def events(items: AsyncIterator[Step | GenAnswer]) -> AsyncIterator[bytes]:
        yield chunk({"role": "assistant", "content": ""})
        async for item in items:  # each token, then the answer
            if not isinstance(item, GenAnswer):
                if item.text:
                    yield chunk({"content": item.text})
                continue
            yield chunk({}, finish(item.finish_reason), softknn=extra(request_id, item))
            if include_usage:
                yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                           "system_fingerprint": item.bundle_version, "choices": [], "usage": item.usage})

    return event_stream(stream, first, events)
