"""The request mix of the load test: what users of softknn send, through the generated client only.

`Mix(queries, seed).draw()` returns one `Call`: the client call to make, the status it must get and,
for the ~5 % deliberately invalid requests, the error type the service must answer with (the one
JSON error shape, DESIGN.md "Errors"). `verify(call, response)` says whether the answer is right:
None, or (failure type, message). No locust here, so tests/deploy runs the same calls in process.

Weights (per 100 draws): single text at the defaults 24, single with other α/k/τ/kernel 14, batches
of 2–8 texts 14, joint mixing 10, evidence off 10, return_tokens 6, exact search or a hybrid
threshold 5, GET /v1/index 4, GET /v1/entries/{id} 4, GET /readyz 4, invalid 5.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every use of the generated client's modules is in this file: the operation names come from the
# app's OpenAPI operation ids, so a rename there changes these imports only.
from softknn_client import AuthenticatedClient
from softknn_client.api.health import readyz as readyz_api
from softknn_client.api.index import entry as entry_api
from softknn_client.api.index import index as index_api
from softknn_client.api.inference import infer as infer_api
from softknn_client.models import (
    EntryResponse,
    ErrorResponse,
    IndexResponse,
    InferRequest,
    InferResponse,
    ReadyzResponseReadyz,
)
from softknn_client.types import Response

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
    if status != call.expect:
        kind = _error_type(response)
        return f"status_{status}:{kind}", f"{call.name}: got {status} ({kind}), expected {call.expect}: " \
                                          f"{response.content[:300]!r}"
    if call.expect >= 400:
        if not isinstance(parsed, ErrorResponse):
            return "bad_error_body", f"{call.name}: {status} body is not the error shape: {response.content[:300]!r}"
        if parsed.error.type_ != call.error_type:
            return f"wrong_error_type:{parsed.error.type_}", f"{call.name}: error type {parsed.error.type_!r}, " \
                                                              f"expected {call.error_type!r}"
        return None
    if parsed is None or isinstance(parsed, ErrorResponse):
        return "bad_body", f"{call.name}: 200 body did not parse: {response.content[:300]!r}"
    problem = call.check(parsed) if call.check else None
    return ("bad_response", f"{call.name}: {problem}") if problem else None


def _infer_check(req: InferRequest, seen: list[str]) -> Callable[[Any], str | None]:
    n = len(req.inputs)

    def check(body: Any) -> str | None:
        if not isinstance(body, InferResponse):
            return f"parsed as {type(body).__name__}"
        if len(body.results) != n:
            return f"{len(body.results)} results for {n} inputs"
        dims = {len(r.embedding) for r in body.results}
        if len(dims) != 1 or 0 in dims:
            return f"embedding sizes {sorted(dims)}"
        for i, r in enumerate(body.results):
            if len(r.evidence) > req.evidence:
                return f"results[{i}]: {len(r.evidence)} evidence items, asked for ≤ {req.evidence}"
            if isinstance(r.tokens, list) != bool(req.return_tokens):
                return f"results[{i}]: tokens {'missing' if req.return_tokens else 'unasked'}"
            if r.diagnostics.mixing != req.mixing:
                return f"results[{i}]: mixing {r.diagnostics.mixing}, asked {req.mixing}"
            if len(seen) < MAX_SEEN_CHUNKS:
                seen.extend(e.chunk_id for e in r.evidence[:1])
        return None

    return check


class Mix:
    """Draws calls with the weights above, from one seeded generator (one Mix per simulated user)."""

    def __init__(self, queries: Sequence[str], seed: int = 0, seen_chunks: list[str] | None = None):
        self.queries = list(queries)
        self.rng = random.Random(seed)
        self.seen = seen_chunks if seen_chunks is not None else []  # chunk ids from evidence, for /v1/entries
        self._kinds, self._weights = list(WEIGHTS), list(WEIGHTS.values())

    def draw(self, kind: str | None = None) -> Call:
        kind = kind or self.rng.choices(self._kinds, self._weights)[0]
        return getattr(self, f"_{kind}")()

    # --- inference -------------------------------------------------------------------------------
    def _texts(self, lo: int, hi: int) -> list[str]:
        return self.rng.sample(self.queries, self.rng.randint(lo, hi))

    def _infer(self, kind: str, req: InferRequest) -> Call:
        return Call(kind, "POST", "/v1/infer", lambda c: infer_api.sync_detailed(client=c, body=req),
                    check=_infer_check(req, self.seen), texts=len(req.inputs))

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
