"""The KBs one app serves, by name, and who may see which (docs/security.md, "Keys").

Each KB is a Runtime (softknn.service.runtime): its own engine, version, reloads, write store and
generation; they share one loaded model, the batcher and the generation and write threads. A
request names its KB with `kb` (a body field on POST routes, a query parameter elsewhere); without
one it gets the only KB the caller may see, else the one named `default`, else a 422 listing the
caller's choices.

No existence leak: a KB the caller's key does not cover answers exactly as a name no KB has
(404 `no KB named 'x'`), and the refusal for a missing scope (403) comes only after that check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from softknn.common.errors import InvalidInput
from softknn.params import DEFAULT_KB
from softknn.service.errors import Forbidden, NotFound
from softknn.service.runtime.core import Runtime

log = logging.getLogger("softknn.service")

Scope = Literal["read", "write"]


@dataclass(frozen=True)
class Principal:
    """Who a request is: the KBs it may see (None = every KB) and what it may do there.
    `who` names the credential in refusals ("the API key", "this key")."""

    kbs: frozenset[str] | None
    write: bool
    who: str = "this key"

    def sees(self, name: str) -> bool:
        return self.kbs is None or name in self.kbs


class KBs:
    """name → Runtime, in the order given (the first one's model is loaded, the others share it)."""

    def __init__(self, runtimes: dict[str, Runtime]):
        if not runtimes:
            raise ValueError("no KB to serve")
        self.runtimes = runtimes
        self.first = next(iter(runtimes.values()))
        # called with the reason when a KB fails to start (`softknn serve` prints it and exits)
        self.on_failed_start: Callable[[str], None] | None = None

    def __iter__(self) -> Iterator[Runtime]:
        return iter(self.runtimes.values())

    def __len__(self) -> int:
        return len(self.runtimes)

    async def start(self) -> None:
        """The model once (the first KB loads it), then every KB's bundle. Never raises."""
        first = self.first
        first.on_failed_start = self._failed(first)
        await first.start()
        if first.encoder is None:  # the model did not load: every KB fails with it
            for rt in self.runtimes.values():
                if rt is not first:
                    rt.status, rt.error = first.status, first.error
            return
        rest = [rt for rt in self.runtimes.values() if rt is not first]
        for rt in rest:
            rt.share_model(first)
            rt.on_failed_start = self._failed(rt)
        await asyncio.gather(*(rt.start() for rt in rest))

    def _failed(self, rt: Runtime) -> Callable[[str], None]:
        def report(reason: str) -> None:
            if self.on_failed_start is not None:
                self.on_failed_start(reason if len(self) == 1 else f"KB {rt.kb!r}: {reason}")

        return report

    def close(self) -> None:
        for rt in self.runtimes.values():
            rt.close()

    # --- access ---------------------------------------------------------------------------------
    def visible(self, who: Principal) -> list[str]:
        return [n for n in self.runtimes if who.sees(n)]

    def pick(self, name: str | None, who: Principal, scope: Scope = "read") -> Runtime:
        """The KB a request names (or its default), as `who` may see it: 404 for a KB it may not
        see, the same as for one that does not exist; then 403 when `scope` is write and `who` may
        only read."""
        if name is None:
            name = self.default_for(who)
        rt = self.runtimes.get(name)
        if rt is None or not who.sees(name):
            raise NotFound(f"no KB named {name!r}", field="kb")
        if scope == "write" and not who.write:
            raise Forbidden(f"{who.who} does not grant KB writes; use a key with the write scope or the admin token")
        return rt

    def default_for(self, who: Principal) -> str:
        """The KB a request without `kb` gets: the only one `who` sees, else `default`, else 422."""
        names = self.visible(who)
        if len(names) == 1:
            return names[0]
        if DEFAULT_KB in names:
            return DEFAULT_KB
        raise InvalidInput(f"this service serves several KBs: name one with kb, one of {names}", field="kb")

    @property
    def status(self) -> str:
        """ready when every KB is; else the first KB's state that is not ready."""
        for rt in self.runtimes.values():
            if rt.status != "ready":
                return rt.status
        return "ready"
