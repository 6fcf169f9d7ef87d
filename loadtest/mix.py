"""The request mix of the load test: what users of softknn send, through the generated client only.

`Mix(queries, seed).draw()` returns one `Call`: the client call to make, the status it must get and,
for the ~5 % deliberately invalid requests, the error type the service must answer with (the one
JSON error shape, DESIGN.md "Errors"). `verify(call, response)` says whether the answer is right:
None, or (failure type, message); `refusal(call, response)` names a right answer that is a refusal
("422 validation_error", "429 queue_full"). No locust here, so tests/deploy runs the same calls in
process.

Weights (per 100 draws): single text at the defaults 24, single with other α/k/τ/kernel 14, batches
of 2–8 texts 14, joint mixing 10, evidence off 10, return_tokens 6, exact search or a hybrid
threshold 5, GET /v1/index 4, GET /v1/entries/{id} 4, GET /readyz 4, invalid 5. A request that
leaves evidence or mixing unset is checked against what the server gives it (`served_defaults`,
GET /v1/index's defaults, passed as `Mix(..., defaults=)`).

Generation joins the mix only when the service serves a generator: `served_generator(client)`
(loadtest.generation, beside the checks of generation answers) asks GET /v1/models and GET
/v1/index, and a model listed that is not the encoder (`/v1/index`'s `model`) is the generator (a
bundle whose generator did not load lists none: its routes answer 409). Then
`Mix(..., generator=name)` adds GEN_WEIGHTS (per 150 draws: the 100 above, plus /v1/generate 12,
/v1/generate streamed 18, /v1/chat/completions streamed 15, invalid generation fields 5);
`generation_only=True` draws from GEN_WEIGHTS alone. A generation call may also get 429 queue_full
with a Retry-After (the generation queue is full): an expected refusal, not a failure.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every use of the generated client's modules is in this file, loadtest.generation and loadtest.streams:
# the operation names come from the app's OpenAPI operation ids, so a rename there changes these imports only.
from softknn_client import AuthenticatedClient
from softknn_client.api.generation import generate as generate_api
from softknn_client.api.health import readyz as readyz_api
from softknn_client.api.index import entry as entry_api
from softknn_client.api.index import index as index_api
from softknn_client.api.inference import infer as infer_api
from softknn_client.api.openai import chat_completions as chat_api
from softknn_client.models import (
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessage,
    EntryResponse,
    ErrorResponse,
    GenerateRequest,
    IndexResponse,
    InferRequest,
    InferResponse,
    ReadyzResponseReadyz,
    StreamOptions,
)
from softknn_client.types import Response

from loadtest.generation import (
    GEN_INVALID,
    GEN_MAX_TOKENS,
    GEN_WEIGHTS,
    QUEUE_FULL,
    chat_stream_check,
    generate_check,
    generate_stream_check,
    is_chat_token,
    is_generate_token,
)
from loadtest.streams import read_stream

QUERIES_FILE = Path(__file__).with_name("queries.txt")
WEIGHTS = {"single": 24, "tuned": 14, "batch": 14, "joint": 10, "no_evidence": 10, "tokens": 6,
           "exact_or_hybrid": 5, "index": 4, "entry": 4, "readyz": 4, "invalid": 5}
# Invalid requests the service must refuse, cheaply, with this status and error type. The sizes sit
# beyond the default limits (64 inputs, 20 000 chars: 1 000 inputs, 51 000 chars) so that moderately
# raised limits still refuse them.
INVALID = {
    "k_zero": (422, "validation_error"),
    "k_huge": (422, "validation_error"),
    "alpha_out_of_range": (422, "validation_error"),
    "no_inputs": (422, "validation_error"),
    "blank_text": (422, "validation_error"),
    "unknown_mixing": (422, "validation_error"),
    "k_as_string": (422, "validation_error"),
    "too_many_inputs": (413, "input_too_large"),
    "text_too_long": (413, "input_too_large"),
    "unknown_entry": (404, "not_found"),
}
MAX_SEEN_CHUNKS = 512


def load_queries(path: Path = QUERIES_FILE) -> list[str]:
    """The non-empty, non-comment lines of queries.txt."""
    lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines()]
    queries = [s for s in lines if s and not s.startswith("#")]
    if not queries:
        raise ValueError(f"{path}: no queries")
    return queries


@dataclass(frozen=True)
class Call:
    """One client call: `send(client)` makes it; `expect` is the status it must get."""

    kind: str  # the task: "batch", "invalid:k_zero", ...
    method: str
    path: str  # the route template, for the stats name
    send: Callable[[AuthenticatedClient], Response[Any]]
    expect: int = 200
    error_type: str | None = None  # for expect ≥ 400: the error.type the body must carry
    check: Callable[[Any], str | None] | None = None  # a 200's parsed body → a problem, or None
    texts: int = 0  # inputs sent (for texts/s)
    refusable: tuple[int, str] | None = None  # another (status, error type) that is an expected refusal

    @property
    def name(self) -> str:
        return f"{self.path} [{self.kind}]"


def _error_type(response: Response[Any]) -> str:
    """error.type of an error body, parsed by the client or not (an undocumented status is not); else '?'."""
    if isinstance(response.parsed, ErrorResponse):
        return response.parsed.error.type_
    try:
        return str(json.loads(response.content)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "?"


def verify(call: Call, response: Response[Any]) -> tuple[str, str] | None:
    """None when the response is what `call` must get; else (failure type, message)."""
    status, parsed = int(response.status_code), response.parsed
    if call.refusable is not None and status == call.refusable[0] != call.expect:
        return _verify_refusal(call, response, call.refusable[1], retry_after=True)
    if status != call.expect:
        kind = _error_type(response)
        return f"status_{status}:{kind}", f"{call.name}: got {status} ({kind}), expected {call.expect}: " \
                                          f"{response.content[:300]!r}"
    if call.expect >= 400:
        return _verify_refusal(call, response, call.error_type, retry_after=False)
    if parsed is None or isinstance(parsed, ErrorResponse):
        return "bad_body", f"{call.name}: 200 body did not parse: {response.content[:300]!r}"
    problem = call.check(parsed) if call.check else None
    return ("bad_response", f"{call.name}: {problem}") if problem else None


def _verify_refusal(call: Call, response: Response[Any], error_type: str | None,
                    retry_after: bool) -> tuple[str, str] | None:
    status, parsed = int(response.status_code), response.parsed
    if not isinstance(parsed, ErrorResponse):
        return "bad_error_body", f"{call.name}: {status} body is not the error shape: {response.content[:300]!r}"
    if parsed.error.type_ != error_type:
        return f"wrong_error_type:{parsed.error.type_}", f"{call.name}: error type {parsed.error.type_!r}, " \
                                                          f"expected {error_type!r}"
    if retry_after and retry_after_s(response) is None:
        return f"no_retry_after:{status}", f"{call.name}: {status} without a Retry-After of whole seconds ≥ 0: " \
                                           f"{response.headers.get('retry-after')!r}"
    return None


def retry_after_s(response: Response[Any]) -> int | None:
    """The Retry-After header in whole seconds (the only form the service sends), or None."""
    value = str(response.headers.get("retry-after", ""))
    return int(value) if value.isdigit() else None


def refusal(call: Call, response: Response[Any]) -> str | None:
    """For a response `verify` passed: "<status> <error type>" when it is a refusal, else None."""
    status = int(response.status_code)
    return f"{status} {_error_type(response)}" if status >= 400 else None


def _infer_check(req: InferRequest, seen: list[str], defaults: dict[str, Any]) -> Callable[[Any], str | None]:
    """The answer's shape; a field the request left unset is checked against the server's default
    (`served_defaults`), and not at all where the Mix was given none."""
    n = len(req.inputs)
    evidence = req.evidence if isinstance(req.evidence, int) else defaults.get("evidence")
    mixing = req.mixing if isinstance(req.mixing, str) else defaults.get("mixing")

    def check(body: Any) -> str | None:
        if not isinstance(body, InferResponse):
            return f"parsed as {type(body).__name__}"
        if len(body.results) != n:
            return f"{len(body.results)} results for {n} inputs"
        dims = {len(r.embedding) for r in body.results}
        if len(dims) != 1 or 0 in dims:
            return f"embedding sizes {sorted(dims)}"
        for i, r in enumerate(body.results):
            if evidence is not None and len(r.evidence) > evidence:
                return f"results[{i}]: {len(r.evidence)} evidence items, asked for ≤ {evidence}"
            if isinstance(r.tokens, list) != bool(req.return_tokens):
                return f"results[{i}]: tokens {'missing' if req.return_tokens else 'unasked'}"
            if mixing is not None and r.diagnostics.mixing != mixing:
                return f"results[{i}]: mixing {r.diagnostics.mixing}, asked {mixing}"
            if len(seen) < MAX_SEEN_CHUNKS:
                seen.extend(e.chunk_id for e in r.evidence[:1])
        return None

    return check


def weights(generator: str | None = None, generation_only: bool = False) -> dict[str, int]:
    """The task weights: WEIGHTS, plus GEN_WEIGHTS when a generator is served; GEN_WEIGHTS alone when only."""
    if generator is None:
        if generation_only:
            raise ValueError("generation_only needs a served generator")
        return dict(WEIGHTS)
    return dict(GEN_WEIGHTS) if generation_only else {**WEIGHTS, **GEN_WEIGHTS}


class Mix:
    """Draws calls with the weights above, from one seeded generator (one Mix per simulated user)."""

    def __init__(self, queries: Sequence[str], seed: int = 0, seen_chunks: list[str] | None = None,
                 generator: str | None = None, generation_only: bool = False,
                 defaults: dict[str, Any] | None = None):
        self.queries = list(queries)
        self.rng = random.Random(seed)
        self.seen = seen_chunks if seen_chunks is not None else []  # chunk ids from evidence, for /v1/entries
        self.generator = generator  # the served generator's id (GET /v1/models), None: no generation
        self.defaults = defaults or {}  # the server's /v1/infer defaults (served_defaults); {}: unset fields unchecked
        w = weights(generator, generation_only)
        self._kinds, self._weights = list(w), list(w.values())

    def draw(self, kind: str | None = None) -> Call:
        kind = kind or self.rng.choices(self._kinds, self._weights)[0]
        return getattr(self, f"_{kind}")()

    # --- inference -------------------------------------------------------------------------------
    def _texts(self, lo: int, hi: int) -> list[str]:
        return self.rng.sample(self.queries, self.rng.randint(lo, hi))

    def _infer(self, kind: str, req: InferRequest) -> Call:
        return Call(kind, "POST", "/v1/infer", lambda c: infer_api.sync_detailed(client=c, body=req),
                    check=_infer_check(req, self.seen, self.defaults), texts=len(req.inputs))

    def _single(self) -> Call:
        return self._infer("single", InferRequest(inputs=self._texts(1, 1)))

    def _tuned(self) -> Call:
        r = self.rng
        return self._infer("tuned", InferRequest(
            inputs=self._texts(1, 1), alpha=r.choice([0.0, 0.3, 0.5, 0.7, 0.9, 1.0]), k=r.choice([1, 4, 8, 16, 32]),
            temperature=r.choice([0.02, 0.05, 0.1, 0.5]), kernel=r.choice(["softmax", "epanechnikov", "uniform"]),
            evidence=r.choice([1, 3, 5, 10])))

    def _batch(self) -> Call:
        r = self.rng
        return self._infer("batch", InferRequest(inputs=self._texts(2, 8), alpha=r.choice([0.5, 0.7, 0.9]),
                                                 k=r.choice([4, 8, 16]), evidence=r.choice([0, 3, 5])))

    def _joint(self) -> Call:
        return self._infer("joint", InferRequest(inputs=self._texts(1, 4), mixing="joint",
                                                 k=self.rng.choice([4, 8, 16])))

    def _no_evidence(self) -> Call:
        return self._infer("no_evidence", InferRequest(inputs=self._texts(1, 4), evidence=0))

    def _tokens(self) -> Call:
        return self._infer("tokens", InferRequest(inputs=self._texts(1, 2), return_tokens=True, evidence=3))

    def _exact_or_hybrid(self) -> Call:
        if self.rng.random() < 0.5:
            return self._infer("exact", InferRequest(inputs=self._texts(1, 2), exact=True))
        return self._infer("hybrid", InferRequest(inputs=self._texts(1, 2), threshold=0.1))

    # --- reads -----------------------------------------------------------------------------------
    def _index(self) -> Call:
        def check(body: Any) -> str | None:
            if not isinstance(body, IndexResponse):
                return f"parsed as {type(body).__name__}"
            ok = body.index.version_id == body.bundle_version
            return None if ok else f"index {body.index.version_id} vs bundle_version {body.bundle_version}"

        return Call("index", "GET", "/v1/index", lambda c: index_api.sync_detailed(client=c), check=check)

    def _entry(self) -> Call:
        if not self.seen:
            return self._single()  # no chunk id known yet
        chunk_id = self.rng.choice(self.seen)

        def check(body: Any) -> str | None:
            if not isinstance(body, EntryResponse):
                return f"parsed as {type(body).__name__}"
            return None if body.entry.chunk_id == chunk_id else f"asked {chunk_id!r}, got {body.entry.chunk_id!r}"

        return Call("entry", "GET", "/v1/entries/{chunk_id}",
                    lambda c: entry_api.sync_detailed(chunk_id, client=c), check=check)

    def _readyz(self) -> Call:
        def check(body: Any) -> str | None:
            ok = isinstance(body, ReadyzResponseReadyz)
            return None if ok else f"parsed as {type(body).__name__}"

        return Call("readyz", "GET", "/readyz", lambda c: readyz_api.sync_detailed(client=c), check=check)

    # --- invalid ---------------------------------------------------------------------------------
    def _invalid(self) -> Call:
        what = self.rng.choice(sorted(INVALID))
        status, error_type = INVALID[what]
        kind = f"invalid:{what}"
        if what == "unknown_entry":
            chunk_id = f"no-such-chunk-{self.rng.randrange(10**9)}"
            return Call(kind, "GET", "/v1/entries/{chunk_id}", lambda c: entry_api.sync_detailed(chunk_id, client=c),
                        expect=status, error_type=error_type)
        q = self._texts(1, 1)
        # The generated models do not validate, so they carry out-of-contract values to the server as is.
        req = {
            "k_zero": lambda: InferRequest(inputs=q, k=0),
            "k_huge": lambda: InferRequest(inputs=q, k=10**6),
            "alpha_out_of_range": lambda: InferRequest(inputs=q, alpha=1.5),
            "no_inputs": lambda: InferRequest(inputs=[]),
            "blank_text": lambda: InferRequest(inputs=[" \t "]),
            "unknown_mixing": lambda: InferRequest(inputs=q, mixing="sideways"),  # type: ignore[arg-type]
            "k_as_string": lambda: InferRequest(inputs=q, k="8"),  # type: ignore[arg-type]
            "too_many_inputs": lambda: InferRequest(inputs=q * 1000),
            "text_too_long": lambda: InferRequest(inputs=["ferry " * 8_500]),
        }[what]()
        return Call(kind, "POST", "/v1/infer", lambda c: infer_api.sync_detailed(client=c, body=req),
                    expect=status, error_type=error_type)

    # --- generation (a served generator only) ------------------------------------------------------
    def _question(self) -> str:
        return self.rng.choice(self.queries)

    def _kb_fields(self) -> dict[str, Any]:
        """k (absent: the bundle's calibrated k) and evidence, as a user tuning them would send."""
        r = self.rng
        out: dict[str, Any] = {"evidence": r.choice([0, 2, 5])}
        k = r.choice([None, None, 1, 2, 4])
        if k is not None:
            out["k"] = k
        return out

    def _generate(self) -> Call:
        r, generator = self.rng, self.generator
        assert generator is not None
        fields = {"max_tokens": r.choice(GEN_MAX_TOKENS), **self._kb_fields()}
        variant = r.choice(["kb", "kb", "plain", "prompt_context", "fixed"])
        variants: dict[str, dict[str, Any]] = {
            "kb": {}, "plain": {"use_kb": False}, "prompt_context": {"context": "prompt"},
            "fixed": {"mixing": "fixed", "alpha": 0.7},  # fixed α runs in torch, beside the decode graph
        }
        more = variants[variant]
        req = GenerateRequest(prompt=self._question(), **fields, **more)
        return Call("generate", "POST", "/v1/generate", lambda c: generate_api.sync_detailed(client=c, body=req),
                    check=generate_check(fields["max_tokens"], fields["evidence"], generator), refusable=QUEUE_FULL)

    def _generate_stream(self) -> Call:
        generator = self.generator
        assert generator is not None
        fields = {"max_tokens": self.rng.choice(GEN_MAX_TOKENS), **self._kb_fields()}
        req = GenerateRequest(prompt=self._question(), stream=True, **fields)
        kwargs = generate_api._get_kwargs(body=req)  # the generated client's request (module docstring of streams)
        return Call("generate_stream", "POST", "/v1/generate", lambda c: read_stream(c, kwargs, is_generate_token),
                    check=generate_stream_check(fields["max_tokens"], fields["evidence"], generator),
                    refusable=QUEUE_FULL)

    def _chat_stream(self) -> Call:
        generator = self.generator
        assert generator is not None
        fields = {"max_tokens": self.rng.choice(GEN_MAX_TOKENS), **self._kb_fields()}
        req = ChatCompletionRequest(messages=[ChatCompletionMessage(role="user", content=self._question())],
                                    model=generator, stream=True, stream_options=StreamOptions(include_usage=True),
                                    **fields)
        kwargs = chat_api._get_kwargs(body=req)
        return Call("chat_stream", "POST", "/v1/chat/completions", lambda c: read_stream(c, kwargs, is_chat_token),
                    check=chat_stream_check(fields["max_tokens"], fields["evidence"], generator),
                    refusable=QUEUE_FULL)

    def _gen_invalid(self) -> Call:
        what = self.rng.choice(sorted(GEN_INVALID))
        status, error_type = GEN_INVALID[what]
        q = self._question()
        turn = [ChatMessage(role="user", content=q)]
        chat = [ChatCompletionMessage(role="user", content=q)]
        # As for /v1/infer: the generated models do not validate, so the bad values reach the server.
        if what.startswith("chat_"):
            body = {
                "chat_n_2": lambda: ChatCompletionRequest(messages=chat, n=2),
                "chat_max_tokens_huge": lambda: ChatCompletionRequest(messages=chat, max_tokens=10**6),
                "chat_unknown_model": lambda: ChatCompletionRequest(messages=chat, model="gpt-4o", stream=True),
            }[what]()
            kwargs, path = chat_api._get_kwargs(body=body), "/v1/chat/completions"
        else:
            req = {
                "prompt_and_messages": lambda: GenerateRequest(prompt=q, messages=turn),
                "no_prompt": lambda: GenerateRequest(),
                "raw_messages": lambda: GenerateRequest(messages=turn, raw=True),
                "max_tokens_huge": lambda: GenerateRequest(prompt=q, max_tokens=10**6),
                "stream_negative_temperature": lambda: GenerateRequest(prompt=q, stream=True, temperature=-1.0),
            }[what]()
            kwargs, path = generate_api._get_kwargs(body=req), "/v1/generate"
        # Every refusal is read by the stream reader: a streamed request's refusal comes before any event.
        return Call(f"invalid:{what}", "POST", path, lambda c: read_stream(c, kwargs, is_generate_token),
                    expect=status, error_type=error_type)
