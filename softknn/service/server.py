"""uvicorn's HTTP protocol with a lingering close, and the one uvicorn.Config every entry point uses.

Why: when the server answers before it has read the whole request (a 408 for a body that did not
arrive in time) and then closes the socket, the client may still be sending, and a client on a
slow link may read nothing until it has sent everything. Closing a TCP socket that holds unread
bytes, or that receives bytes after it is closed, makes the kernel answer with a reset (RST)
instead of a FIN, and a reset destroys the answer before the client reads it: the client sees
`ConnectionResetError`, not its 408.

The lingering close (Apache httpd's and nginx's `lingering_close`): instead of closing, shut down
the write side (the client can read the answer, then EOF), keep reading and discarding what the
client still sends, and close for real when the client closes its side, or when nothing has
arrived for `limits.linger_idle_s` (every read restarts that timer, nginx's `lingering_timeout`),
or after `limits.linger_total_s` in all however steadily it sends (nginx's `lingering_time`). A
client that is still sending is thus read for as long as it sends, up to the total cap, and never
meets a closed socket. At most `limits.linger_max_connections` connections linger at once, so a
flood of slow clients cannot pin memory and sockets; past that a connection closes at once.
Every close uvicorn makes through the transport goes this way; a connection that is already gone,
or whose client has already closed its side, closes at once, and so does every connection on
server shutdown (a lingering one included).

The settings reach the protocol through `uvicorn_config`: it builds one `Linger` per server (from
the app's `app.state.settings.limits`) and hangs it on the uvicorn.Config that every connection's
protocol receives; a server started without it (`uvicorn --http softknn.service.server:...`) lingers with
the defaults of `softknn.params.Limits`. The app's /metrics shows `softknn_lingering_connections`
and `softknn_lingering_closes_total{reason}` (eof, idle, total, shutdown, lost, full).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("softknn.service")


class Linger:
    """One server's lingering-close policy and its counts. All its connections run on the server's
    event loop, so the counts need no lock; other threads (metrics, tests) only read them."""

    def __init__(self, idle_s: float | None = None, total_s: float | None = None,
                 max_connections: int | None = None):
        from softknn.params import Limits

        d = Limits()
        self.idle_s = float(d.linger_idle_s if idle_s is None else idle_s)
        self.total_s = float(d.linger_total_s if total_s is None else total_s)
        self.max_connections = int(d.linger_max_connections if max_connections is None else max_connections)
        self.active = 0  # connections lingering now
        self.closes: Counter[str] = Counter()  # lingers ended (or refused, "full"), by reason

    @classmethod
    def from_limits(cls, limits) -> Linger:
        return cls(limits.linger_idle_s, limits.linger_total_s, limits.linger_max_connections)

    def collector(self):
        """A Prometheus collector of the counts, for the app's registry."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        policy = self

        class LingerCollector:
            def collect(self):
                yield GaugeMetricFamily("softknn_lingering_connections",
                                        "connections in a lingering close now", value=policy.active)
                c = CounterMetricFamily("softknn_lingering_closes", "lingering closes by how they ended "
                                        "(full: none was free, closed at once)", labels=["reason"])
                for reason in ("eof", "idle", "total", "shutdown", "lost", "full"):
                    c.add_metric([reason], policy.closes[reason])
                yield c

        return LingerCollector()


class LingeringTransport:
    """Wraps an asyncio transport: `close()` becomes shut-write, drain, close (see the module doc)."""

    def __init__(self, transport: asyncio.Transport, policy: Linger):
        self._t = transport
        self.policy = policy
        self.lingering = False  # holds one of the policy's slots while True
        self.peer_eof = False  # the client has closed its side: nothing left to drain
        self.no_linger = False  # server shutdown: every close is immediate
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = self._hard_end = 0.0

    def __getattr__(self, name):  # everything else is the transport's own
        return getattr(self._t, name)

    def close(self) -> None:
        t, p = self._t, self.policy
        if self.lingering or t.is_closing():
            return
        if self.no_linger or self.peer_eof or p.idle_s <= 0 or not t.can_write_eof():
            t.close()
            return
        if p.active >= p.max_connections:
            p.closes["full"] += 1
            t.close()
            return
        try:
            t.write_eof()  # FIN after the buffered answer; the read side stays open
            t.resume_reading()  # reads may have been paused by flow control: drain them
        except (OSError, RuntimeError):  # the peer is already gone
            t.close()
            return
        self.lingering = True
        p.active += 1
        loop = asyncio.get_running_loop()
        self._last_read = now = loop.time()
        self._hard_end = now + p.total_s
        self._timer = loop.call_at(min(now + p.idle_s, self._hard_end), self._check)

    def read(self) -> None:
        """Bytes arrived while lingering (dropped by the protocol): restart the idle timer."""
        self._last_read = asyncio.get_running_loop().time()

    def _check(self) -> None:
        self._timer = None
        if not self.lingering:
            return
        loop = asyncio.get_running_loop()
        now, idle_end = loop.time(), self._last_read + self.policy.idle_s
        if now >= self._hard_end:
            self.end("total")
        elif now >= idle_end:
            self.end("idle")
        else:  # read since the timer was set: wait out the rest
            self._timer = loop.call_at(min(idle_end, self._hard_end), self._check)

    def release(self, reason: str) -> bool:
        """Stop lingering without closing: cancel the timer, give back the slot, count `reason`.
        False when it was not lingering."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.lingering:
            return False
        self.lingering = False
        self.policy.active -= 1
        self.policy.closes[reason] += 1
        return True

    def end(self, reason: str) -> None:
        """The end of the linger: close for real."""
        if self.release(reason):
            self._t.close()


class _LingeringMixin:
    """For uvicorn's HTTP protocol classes: its transport is a LingeringTransport; while the
    connection lingers, what arrives is discarded and the client's EOF ends it."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        config = self.config  # type: ignore[attr-defined]
        policy = getattr(config, "softknn_linger", None)
        if policy is None:  # not built by uvicorn_config: the defaults, shared by this server's connections
            policy = config.softknn_linger = Linger()
        self._linger = LingeringTransport(transport, policy)
        super().connection_made(self._linger)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._linger.lingering:
            self._linger.read()  # the answer is out and the request is over: read and drop
            return
        super().data_received(data)  # type: ignore[misc]

    def eof_received(self) -> None:
        if self._linger.lingering:
            self._linger.end("eof")  # the client is done sending: close now
            return
        self._linger.peer_eof = True
        super().eof_received()  # type: ignore[misc]

    def shutdown(self) -> None:
        """Server shutdown: close without lingering (a linger would hold the shutdown up)."""
        self._linger.no_linger = True
        self._linger.end("shutdown")
        super().shutdown()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._linger.release("lost")  # gone while lingering (a reset); no-op after end()
        super().connection_lost(exc)  # type: ignore[misc]


class LingeringH11Protocol(_LingeringMixin, H11Protocol):
    pass


_PROTOCOL: type[asyncio.Protocol] = LingeringH11Protocol
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional in uvicorn; h11 is always there
    pass
else:

    class LingeringHttpToolsProtocol(_LingeringMixin, HttpToolsProtocol):
        pass

    _PROTOCOL = LingeringHttpToolsProtocol


def http_protocol() -> type[asyncio.Protocol]:
    """The lingering-close protocol over httptools where installed (uvicorn's own "auto" choice), else h11."""
    return _PROTOCOL


class LingerConfig(uvicorn.Config):
    """uvicorn.Config carrying the server's lingering-close policy to its protocol instances."""

    softknn_linger: Linger


def app_linger(app) -> Linger:
    """The app's Linger (`app.state.linger`), made once from `app.state.settings.limits` and
    registered with the app's metrics; the defaults for an app without settings."""
    state = getattr(app, "state", None)
    policy = getattr(state, "linger", None) if state is not None else None
    if policy is not None:
        return policy
    settings = getattr(state, "settings", None) if state is not None else None
    policy = Linger.from_limits(settings.limits) if settings is not None else Linger()
    if state is not None:
        state.linger = policy
        metrics = getattr(state, "metrics", None)
        if metrics is not None:
            metrics.registry.register(policy.collector())
    return policy


def uvicorn_config(app, *, host: str, port: int, **kw) -> LingerConfig:
    """uvicorn.Config with the lingering-close protocol and the app's linger settings:
    `softknn serve` and the tests' servers use it."""
    kw.setdefault("log_config", None)
    kw.setdefault("access_log", False)
    config = LingerConfig(app, host=host, port=port, http=http_protocol(), **kw)
    config.softknn_linger = app_linger(app)
    return config
