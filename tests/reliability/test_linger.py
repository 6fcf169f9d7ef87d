"""The lingering close keeps reading while a client that was answered early keeps sending.

A client on a slow link that is still uploading when its 408 comes keeps sending, and reads only
once it has sent everything. The server must go on reading (and dropping) what arrives until the
client is done, so that closing never meets unread bytes (a reset that destroys the answer); it
stops after `limits.linger_idle_s` without a byte, after `limits.linger_total_s` in all, and
lingers on at most `limits.linger_max_connections` connections at once (softknn/service/server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import NamedTuple

from softknn.service.app import create_app
from tests.harness import API_KEY, threaded_server
from tests.reliability.conftest import bearer, settings_for

BODY = b'{"inputs": ["a slow uploader, 40 bytes"]}'  # 41 bytes: ~8 s at a byte every 0.2 s


class Upload(NamedTuple):
    status: int | str  # the HTTP status, or the name of the exception that stopped the client
    error: str | None  # error.type of the JSON error body
    message: str | None  # error.message
    closed: bool  # the answer was followed by EOF
    sent: int  # body bytes sent
    answered_at: float | None  # perf_counter when the answer's EOF was read (the server's FIN)


def _head(url: str, length: int) -> tuple[str, int, bytes]:
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    head = (f"POST /v1/infer HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()
    return host, int(port), head


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, str | None, str | None, bool]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    status = int(head.split(b" ", 2)[1])
    length = re.search(rb"(?im)^content-length:\s*(\d+)\r$", head)
    payload = await asyncio.wait_for(reader.readexactly(int(length.group(1))), 10) if length else b""
    rest = await asyncio.wait_for(reader.read(), 10)
    try:
        err = json.loads(payload)["error"]
        error, message = err["type"], err["message"]
    except (ValueError, KeyError, TypeError):
        error = message = None
    return status, error, message, rest == b"" and reader.at_eof()


async def upload_then_read(url: str, body: bytes = BODY, byte_every_s: float = 0.2) -> Upload:
    """A slow uploader: headers, then one body byte every `byte_every_s` whatever the server says;
    it reads the answer only once the whole body is sent."""
    host, port, head = _head(url, len(body))
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    try:
        writer.write(head)
        await writer.drain()
        for b in body:
            await asyncio.sleep(byte_every_s)
            writer.write(bytes([b]))
            await writer.drain()
            sent += 1
        status, error, message, closed = await _read_answer(reader)
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        return Upload(type(e).__name__, None, None, True, sent, None)
    finally:
        writer.close()
    return Upload(status, error, message, closed, sent, time.perf_counter())


async def answered_then(url: str, *, length: int, send: int, byte_every_s: float, hold_s: float) -> Upload:
    """Reads the answer as soon as it comes; meanwhile sends `send` body bytes of a declared
    `length`, one every `byte_every_s` (stopping when a send fails), then holds the connection
    open, silent, until `hold_s` after the start before closing it."""
    host, port, head = _head(url, length)
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head)
    await writer.drain()

    async def answer():
        out = await _read_answer(reader)
        return out, time.perf_counter()

    reading = asyncio.ensure_future(answer())
    sent = 0
    with contextlib.suppress(OSError):
        for _ in range(send):
            await asyncio.sleep(byte_every_s)
            writer.write(b" ")
            await writer.drain()
            sent += 1
    try:
        (status, error, message, closed), at = await reading
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        return Upload(type(e).__name__, None, None, True, sent, None)
    await asyncio.sleep(max(0.0, t0 + hold_s - time.perf_counter()))
    writer.close()
    return Upload(status, error, message, closed, sent, at)


@contextlib.contextmanager
def server(encoder, bundle, **limits) -> Iterator[tuple[str, object, object]]:
    """A real server (uvicorn in a thread) with these limits: (url, httpx client, app.state.linger).
    Keep-alive of the test's own client outlasts the test, so only the test's connections linger."""
    app = create_app(settings_for(bundle, limits=limits), encoder=encoder)
    with threaded_server(app, headers=bearer(API_KEY), timeout_keep_alive=120) as client:
        yield str(client.base_url), client, app.state.linger


def wait_for(cond, timeout: float = 20.0) -> float:
    """Poll `cond` until true; the perf_counter when it was seen true."""
    end = time.perf_counter() + timeout
    while not cond():
        assert time.perf_counter() < end, "condition not reached"
        time.sleep(0.01)
    return time.perf_counter()


def test_120_slow_uploaders_still_sending_after_their_408_all_read_it(encoder, small_bundle):
    """120 clients trickling a 41-byte body (a byte every 0.2 s, ~8 s) at a server whose body
    deadline is 1 s, with well-formed requests beside them: each is answered 408 at ~1 s, keeps
    sending for ~7 s more, then reads; every one must read its 408 and JSON error, then EOF."""
    with server(encoder, small_bundle, body_timeout_s=1.0) as (url, client, linger):

        async def scenario():
            stop = asyncio.Event()

            async def well_formed() -> list[int]:
                statuses = []
                while not stop.is_set():
                    r = await asyncio.to_thread(client.post, "/v1/infer", json={"inputs": ["a dog on board?"]})
                    statuses.append(r.status_code)
                    await asyncio.sleep(0.05)
                return statuses

            load = [asyncio.create_task(well_formed()) for _ in range(2)]
            uploads = await asyncio.gather(*(upload_then_read(url) for _ in range(120)))
            stop.set()
            return uploads, [s for t in load for s in await t]

        t0 = time.perf_counter()
        uploads, good = asyncio.run(scenario())
        took = time.perf_counter() - t0
        wait_for(lambda: linger.active == 0)
        closes = dict(linger.closes)
    seen = Counter((u.status, u.error, u.closed, u.sent) for u in uploads)
    assert seen == Counter({(408, "request_timeout", True, len(BODY)): 120}), (seen, closes)
    assert {u.message for u in uploads} == {"request body not received within 1 s"}
    assert good and set(good) == {200}, Counter(good)
    assert closes == {"eof": 120}, closes  # each lingered until its client had sent all and closed
    print(f"\n120 slow uploaders: {seen}; well-formed: {len(good)} × 200; {took:.1f} s; closes {closes}")


def test_a_silent_lingerer_is_closed_after_the_idle_timeout(encoder, small_bundle):
    with server(encoder, small_bundle, body_timeout_s=0.3, linger_idle_s=0.5, linger_total_s=20) as (url, _, linger):

        async def scenario():
            client = asyncio.create_task(answered_then(url, length=40, send=2, byte_every_s=0.05, hold_s=2.5))
            while not linger.closes:  # the client holds its end open, silent, for 2.5 s
                await asyncio.sleep(0.01)
            ended = time.perf_counter()
            return await client, ended

        u, ended = asyncio.run(scenario())
        closes = dict(linger.closes)
    assert (u.status, u.error, u.closed) == (408, "request_timeout", True)
    assert closes == {"idle": 1}, closes
    # 0.5 s after the answer's FIN (polled; generous above for a loaded box)
    assert 0.3 < ended - u.answered_at < 2.5, ended - u.answered_at


def test_a_client_trickling_on_is_closed_at_the_total_cap(encoder, small_bundle):
    with server(encoder, small_bundle, body_timeout_s=0.3, linger_idle_s=1.0, linger_total_s=2.5) as (url, _, linger):
        t0 = time.perf_counter()
        u = asyncio.run(answered_then(url, length=200, send=150, byte_every_s=0.05, hold_s=0))
        wait_for(lambda: linger.active == 0)
        closes = dict(linger.closes)
        took = time.perf_counter() - t0
    assert (u.status, u.error, u.closed) == (408, "request_timeout", True)
    assert closes == {"total": 1}, closes  # a byte every 0.05 s: the idle timer never ran out
    assert 10 < u.sent < 150, u.sent  # it sent on past the 408 (~6 bytes in) until the close stopped it
    assert took < 10, took


def test_at_most_linger_max_connections_linger_the_rest_close_at_once(encoder, small_bundle):
    with server(encoder, small_bundle, body_timeout_s=0.3, linger_idle_s=10,
                linger_max_connections=2) as (url, client, linger):

        async def scenario():
            tasks = [asyncio.create_task(answered_then(url, length=40, send=1, byte_every_s=0.05, hold_s=3.0))
                     for _ in range(5)]
            await asyncio.sleep(1.5)  # all five answered, none has closed its end yet
            during = (linger.active, dict(linger.closes))
            return await asyncio.gather(*tasks), during

        uploads, (active, closes_during) = asyncio.run(scenario())
        wait_for(lambda: linger.active == 0)
        closes = dict(linger.closes)
        exposed = client.get("/metrics").text
    assert [(u.status, u.error, u.closed) for u in uploads] == [(408, "request_timeout", True)] * 5
    assert (active, closes_during) == (2, {"full": 3}), (active, closes_during)
    assert closes == {"full": 3, "eof": 2}, closes  # the two that lingered ended with the client's close
    assert 'softknn_lingering_closes_total{reason="full"} 3.0' in exposed
    assert "softknn_lingering_connections 0.0" in exposed


def test_server_shutdown_ends_a_linger_at_once(encoder, small_bundle):
    with server(encoder, small_bundle, body_timeout_s=0.3, linger_idle_s=20, linger_total_s=30) as (url, _, linger):

        async def lingering_client():
            host, port, head = _head(url, 40)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(head + b"{")
            await writer.drain()
            answer = await _read_answer(reader)
            return answer, reader, writer

        loop = asyncio.new_event_loop()
        (status, error, _, closed), reader, writer = loop.run_until_complete(lingering_client())
        assert (status, error, closed) == (408, "request_timeout", True)
        wait_for(lambda: linger.active == 1)
        t0 = time.perf_counter()
    took = time.perf_counter() - t0  # leaving the block stops the server (graceful shutdown 5 s)
    writer.close()
    loop.close()
    assert (linger.active, dict(linger.closes)) == (0, {"shutdown": 1})
    assert took < 3.0, took
