"""Streamed generation calls through the generated client: its request, its httpx client, our SSE reader.

The generated client (clients/python) reads one JSON body per response, so it cannot consume a
`text/event-stream` answer. A streamed call therefore builds its request with the generated
operation module's own `_get_kwargs` (method, path and the JSON of the typed request model) and
sends it with the client's httpx client (`client.get_httpx_client()`: base URL, bearer token,
timeout), reading the events as they arrive. A refusal before the first token (422, 429 with
Retry-After) is an ordinary JSON error answer, returned unread like any other call's.

`Streamed` is the parsed body of a 200: the events (JSON objects, `[DONE]` excluded), whether
`[DONE]` came last, and the arrival time of each token event, from which
    ttft_s = t(first token event) − t(request sent)
    tokens_per_s = (n − 1) / (t(last token event) − t(first token event))   (n ≥ 2 token events)
so the time to first token is not in the per-user decode rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from softknn_client import AuthenticatedClient
from softknn_client.models import ErrorResponse
from softknn_client.types import Response


@dataclass
class Streamed:
    """A streamed answer as read: its events and when each token event arrived (seconds from the send)."""

    events: list[dict] = field(default_factory=list)  # every data: event but [DONE], parsed
    done: bool = False  # the last event was [DONE]
    token_times: list[float] = field(default_factory=list)  # per token event, s since the request was sent

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def tokens_per_s(self) -> float | None:
        """(n − 1) / (t_last − t_first) over the token events; None below 2 tokens or a zero span."""
        t = self.token_times
        span = t[-1] - t[0] if len(t) >= 2 else 0.0
        return (len(t) - 1) / span if span > 0 else None


def _parse_error(content: bytes) -> ErrorResponse | None:
    try:
        return ErrorResponse.from_dict(json.loads(content))
    except (ValueError, KeyError, TypeError):
        return None


def read_stream(client: AuthenticatedClient, kwargs: dict[str, Any],
                is_token: Callable[[dict], bool]) -> Response[Streamed | ErrorResponse | None]:
    """Send the generated request `kwargs` with the client's httpx client and read its event stream.

    A 200 parses into Streamed (`is_token(event)` says which events are tokens); any other status is
    read whole and parsed into the one error shape (None when it is not that shape)."""
    start = time.perf_counter()
    with client.get_httpx_client().stream(**kwargs) as r:
        status = r.status_code
        if status != 200 or not r.headers.get("content-type", "").startswith("text/event-stream"):
            content = r.read()
            return Response(status_code=HTTPStatus(status), content=content, headers=r.headers,
                            parsed=_parse_error(content) if status != 200 else None)
        out, raw = Streamed(), []
        for line in r.iter_lines():
            raw.append(line)
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if out.done:  # anything after [DONE] is a broken stream
                out.done = False
            if data == "[DONE]":
                out.done = True
                continue
            event = json.loads(data)  # a broken event is a client_error:JSONDecodeError
            out.events.append(event)
            if is_token(event):
                out.token_times.append(time.perf_counter() - start)
        return Response(status_code=HTTPStatus(status), content="\n".join(raw).encode(), headers=r.headers,
                        parsed=out)
