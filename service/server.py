"""uvicorn's HTTP protocol with a lingering close, and the one uvicorn.Config every entry point uses.

Why (issue 12): when the server answers before it has read the whole request (a 408 for a body
that did not arrive in time, a 413 for one too large) and then closes the socket, the client may
still be sending. Closing a TCP socket that holds unread bytes makes the kernel answer with a
reset (RST) instead of a FIN, and a reset can destroy the answer before the client reads it: the
client sees `ConnectionResetError`, not its 408. Measured before the fix with 200 slow clients
under load (tests/reliability/test_hostile.py): 44 of 200 got a reset.

The lingering close (Apache httpd's `lingering_close`, nginx's `lingering_close`): instead of
closing, shut down the write side (the client reads the answer, then EOF), keep reading and
discarding what the client still sends, and close when the client closes its side or after
`linger_s` at the most. Every close that uvicorn makes through the transport goes this way; a
connection that is already gone closes at once.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("softknn.service")

LINGER_S = 2.0  # nginx's lingering_timeout is 5 s, Apache's per-read linger 2 s; a client reads an answer in ms


class LingeringTransport:
    """Wraps an asyncio transport: `close()` becomes shut-write, drain, close (see the module doc)."""

    def __init__(self, transport: asyncio.Transport, linger_s: float):
        self._t = transport
        self.linger_s = linger_s
        self.lingering = False
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name):  # everything else is the transport's own
        return getattr(self._t, name)

    def close(self) -> None:
        t = self._t
        if self.lingering or t.is_closing():
            return
        if not t.can_write_eof() or self.linger_s <= 0:
            t.close()
            return
        self.lingering = True
        try:
            t.write_eof()  # FIN after the buffered answer; the read side stays open
            t.resume_reading()  # reads may have been paused by flow control: drain them
        except (OSError, RuntimeError):  # the peer is already gone
            t.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self.linger_s, self.abort_linger)

    def abort_linger(self) -> None:
        """The end of the linger: close for real (the client had linger_s to read the answer)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._t.close()


class _LingeringMixin:
    """For uvicorn's HTTP protocol classes: its transport is a LingeringTransport; while the
    connection lingers, what arrives is discarded and the client's EOF ends it."""

    linger_s = LINGER_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._linger = LingeringTransport(transport, self.linger_s)
        super().connection_made(self._linger)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._linger.lingering:
            return  # the answer is out and the request is over: read and drop
        super().data_received(data)  # type: ignore[misc]

    def eof_received(self) -> bool | None:
        if self._linger.lingering:
            self._linger.abort_linger()  # the client is done sending: close now
            return None
        return super().eof_received()  # type: ignore[misc]

    def shutdown(self) -> None:
        """Server shutdown: close without lingering (idle keep-alive connections would hold it up)."""
        self._linger.linger_s = 0.0
        super().shutdown()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._linger.lingering = False
        if self._linger._timer is not None:
            self._linger._timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]


class LingeringH11Protocol(_LingeringMixin, H11Protocol):
    pass


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional in uvicorn; h11 is always there
    HttpToolsProtocol = None


if HttpToolsProtocol is not None:

    class LingeringHttpToolsProtocol(_LingeringMixin, HttpToolsProtocol):
        pass


def http_protocol() -> type[asyncio.Protocol]:
    """The lingering-close protocol over httptools where installed (uvicorn's own "auto" choice), else h11."""
    return LingeringHttpToolsProtocol if HttpToolsProtocol is not None else LingeringH11Protocol


def uvicorn_config(app, *, host: str, port: int, **kw) -> uvicorn.Config:
    """uvicorn.Config with the lingering-close protocol: `softknn serve` and the tests' servers use it."""
    kw.setdefault("log_config", None)
    kw.setdefault("access_log", False)
    return uvicorn.Config(app, host=host, port=port, http=http_protocol(), **kw)
