"""The generation tasks' parts that need no Mix: their weights and invalid fields, which generator
the service serves, the checks of a generation answer (one JSON object or a stream), and what a call
measured. loadtest.mix draws the calls; loadtest.streams reads the streamed ones.

A finished answer must end with `stop` or `length` (then exactly max_tokens tokens), list one token
per generated token whose texts make its text, and carry no more evidence than asked. A streamed
/v1/generate answer is its token events ({token, text}), then one answer object, then [DONE]; a
streamed chat completion is chat.completion.chunk events of one id: {role: assistant} first, the
content deltas, one chunk with the finish_reason and `softknn`, then the usage chunk, then [DONE].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from softknn_client import AuthenticatedClient
from softknn_client.api.index import index as index_api
from softknn_client.api.openai import models as models_api
from softknn_client.models import (
    GenerateResponse,
    IndexResponse,
    IndexResponseDefaultsType0,
    ModelList,
    SoftknnExtra,
    Usage,
)
from softknn_client.types import Response

from loadtest.streams import Streamed

# With a generator (loadtest.mix's docstring): its share of the draws, and its invalid fields, refused
# with 422 (the bounds sit far beyond the default limits: max_tokens 512) or 404 for another model's name.
GEN_WEIGHTS = {"generate": 12, "generate_stream": 18, "chat_stream": 15, "gen_invalid": 5}
GEN_INVALID = {
    "prompt_and_messages": (422, "validation_error"),
    "no_prompt": (422, "validation_error"),
    "raw_messages": (422, "validation_error"),
    "max_tokens_huge": (422, "validation_error"),
    "stream_negative_temperature": (422, "validation_error"),
    "chat_n_2": (422, "validation_error"),
    "chat_max_tokens_huge": (422, "validation_error"),
    "chat_unknown_model": (404, "model_not_found"),
}
QUEUE_FULL = (429, "queue_full")  # what any generation call may get instead of its answer
GEN_MAX_TOKENS = (16, 32)


def served_generator(client: AuthenticatedClient) -> str | None:
    """The generator's id when GET /v1/models lists a model besides the encoder (GET /v1/index's
    `model`), else None. Raises RuntimeError when either route does not answer 200."""
    models = models_api.sync_detailed(client=client)
    index = index_api.sync_detailed(client=client)
    if not isinstance(models.parsed, ModelList) or not isinstance(index.parsed, IndexResponse):
        raise RuntimeError(f"GET /v1/models {int(models.status_code)}, GET /v1/index {int(index.status_code)}: "
                           f"{models.content[:200]!r} {index.content[:200]!r}")
    others = [m.id for m in models.parsed.data if m.id != index.parsed.model]
    return others[0] if others else None


def served_defaults(client: AuthenticatedClient) -> dict[str, Any]:
    """What the service gives an /v1/infer request that leaves a field unset (GET /v1/index's
    `defaults.infer`): the load test checks answers to such requests against these. Raises
    RuntimeError when the route does not answer 200 or names no defaults."""
    index = index_api.sync_detailed(client=client)
    if not isinstance(index.parsed, IndexResponse) or not isinstance(index.parsed.defaults, IndexResponseDefaultsType0):
        raise RuntimeError(f"GET /v1/index {int(index.status_code)}: no defaults in {index.content[:200]!r}")
    infer = index.parsed.defaults.to_dict().get("infer")
    if not isinstance(infer, dict):
        raise RuntimeError(f"GET /v1/index: defaults without 'infer': {index.content[:200]!r}")
    return infer


def is_generate_token(event: dict) -> bool:
    return "token" in event


def is_chat_token(event: dict) -> bool:
    choices = event.get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def _answer_problem(finish_reason: str, usage: Usage, tokens: list, evidence: list, text: str,
                    max_tokens: int, evidence_max: int) -> str | None:
    """What is wrong with a finished answer (None: nothing): its end, its token count, its evidence."""
    n = usage.completion_tokens
    if finish_reason not in ("stop", "length"):
        return f"finish_reason {finish_reason!r}"
    if not 0 <= n <= max_tokens or (finish_reason == "length" and n != max_tokens):
        return f"{n} completion tokens ({finish_reason}) for max_tokens {max_tokens}"
    if len(tokens) != n:
        return f"{len(tokens)} tokens listed, usage says {n}"
    if "".join(t.text for t in tokens) != text:
        return "the tokens' text is not the answer's text"
    if len(evidence) > evidence_max:
        return f"{len(evidence)} evidence items, asked for ≤ {evidence_max}"
    return None


def generate_check(max_tokens: int, evidence: int, generator: str) -> Callable[[Any], str | None]:
    def check(body: Any) -> str | None:
        if not isinstance(body, GenerateResponse):
            return f"parsed as {type(body).__name__}"
        if body.generator != generator:
            return f"generator {body.generator!r}, served {generator!r}"
        return _answer_problem(body.finish_reason, body.usage, body.tokens, body.evidence, body.text,
                               max_tokens, evidence)

    return check


def _stream_problem(body: Any) -> str | None:
    if not isinstance(body, Streamed):
        return f"parsed as {type(body).__name__}"
    errors = [e["error"].get("type") for e in body.events if isinstance(e.get("error"), dict)]
    if errors:
        return f"error event {errors[0]!r} after {len(body.token_times)} tokens"
    if not body.done:
        return "the stream did not end with [DONE]"
    return None


def generate_stream_check(max_tokens: int, evidence: int, generator: str) -> Callable[[Any], str | None]:
    """Token events ({token, text}) first, then one answer object, then [DONE]; the tokens are the answer's."""
    def check(body: Any) -> str | None:
        if (problem := _stream_problem(body)) is not None:
            return problem
        n = len(body.token_times)
        if len(body.events) != n + 1 or any(is_generate_token(e) for e in body.events[n:]):
            return f"{len(body.events)} events: expected {n} token events, then one answer"
        try:
            answer = GenerateResponse.from_dict(body.events[-1])
        except (KeyError, TypeError, ValueError) as e:
            return f"the answer event did not parse: {e!r}"
        if "".join(e["text"] for e in body.events[:n]) != answer.text:
            return "the streamed tokens' text is not the answer's text"
        if answer.generator != generator:
            return f"generator {answer.generator!r}, served {generator!r}"
        return _answer_problem(answer.finish_reason, answer.usage, answer.tokens, answer.evidence, answer.text,
                               max_tokens, evidence)

    return check


def chat_stream_check(max_tokens: int, evidence: int, generator: str) -> Callable[[Any], str | None]:
    """chat.completion.chunk events of one id: {role: assistant} first, content deltas, one with the
    finish_reason and `softknn`, then the usage chunk (no choices), then [DONE]."""
    def check(body: Any) -> str | None:
        if (problem := _stream_problem(body)) is not None:
            return problem
        try:
            return _chat_chunks_problem(body.events, max_tokens, evidence, generator)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            return f"a malformed chunk: {e!r}"

    return check


def _chat_chunks_problem(chunks: list[dict], max_tokens: int, evidence: int, generator: str) -> str | None:
    if len({(c["id"], c["object"], c["model"]) for c in chunks}) != 1 or not chunks[0]["id"].startswith("chatcmpl-"):
        return f"chunks of several ids/objects/models: {sorted({c['id'] for c in chunks})[:3]}"
    if chunks[0]["model"] != generator or chunks[0]["object"] != "chat.completion.chunk":
        return f"model {chunks[0]['model']!r}, object {chunks[0]['object']!r}"
    if chunks[0]["choices"][0]["delta"] != {"role": "assistant", "content": ""}:
        return f"first delta {chunks[0]['choices'][0]['delta']!r}"
    with_choices, usage_chunks = [c for c in chunks if c["choices"]], [c for c in chunks if not c["choices"]]
    if len(usage_chunks) != 1 or chunks[-1] is not usage_chunks[0]:
        return f"{len(usage_chunks)} usage chunks, expected one, last"
    last = with_choices[-1]
    extra = SoftknnExtra.from_dict(last["softknn"])
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    return _answer_problem(last["choices"][0]["finish_reason"], Usage.from_dict(usage_chunks[0]["usage"]),
                           extra.tokens, extra.evidence, content, max_tokens, evidence)


@dataclass
class GenStats:
    """What one generation call that got its answer measured: tokens generated, and for a stream its
    time to first token and its decode rate (loadtest.streams.Streamed)."""

    tokens: int
    ttft_ms: float | None = None
    tokens_per_s: float | None = None


def gen_stats(response: Response[Any]) -> GenStats | None:
    """GenStats of a 200 generation answer (streamed: its token events), else None."""
    body = response.parsed
    if int(response.status_code) != 200:
        return None
    if isinstance(body, Streamed):
        ttft = body.ttft_s
        return GenStats(len(body.token_times), None if ttft is None else ttft * 1000, body.tokens_per_s)
    if isinstance(body, GenerateResponse):
        return GenStats(body.usage.completion_tokens)
    return None
