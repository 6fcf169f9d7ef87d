"""Every command's parameter options, derived from the parameter table (softknn.common.table), as
vLLM's `EngineArgs.add_cli_args` derives its flags from its config classes.

`@table_options(InferParams, "alpha", "k", ...)` under `app.command()` adds one option per named
parameter (every one the table marks an option when none is named): `--NAME` (a bool `--NAME/--no-NAME`,
or the table's own flags), its type, its choices (a Literal), its help with its bounds, unset (None)
by default; a deprecated name is a hidden option of its own. The command gets their values as one
mapping, its `given` argument, for softknn.common.table.fill: the step that fills what they leave unset
from the settings and the bundle, as the HTTP routes do.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer

from softknn.common.console import fail
from softknn.common.errors import InvalidInput, SoftKNNError
from softknn.common.filters import parse_filter
from softknn.common.table import Entry, entries, entry, interval

F = TypeVar("F", bound=Callable[..., Any])


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _annotation(e: Entry) -> Any:
    """The option's type: the parameter's own, but a tuple of strings is a repeated option and a
    filter its JSON text."""
    if e.type is bool or e.type in (int, float, str) or e.choices is not None:
        return e.type | None
    if e.type == tuple[str, ...]:
        return list[str] | None
    return str | None  # a filter: JSON, parsed by `_value`


def option(e: Entry, *, hidden: bool = False, name: str | None = None, help: str | None = None) -> inspect.Parameter:
    """The typer option of parameter `e` (`name`: a deprecated name of it), unset by default."""
    decl = flag(name or e.name)
    flags = e.param.flags if name is None and e.param.flags else (
        (f"{decl}/--no-{decl[2:]}",) if e.type is bool else (decl,))
    bounds = interval(e.param)
    text = help or (e.param.help or e.param.description) + (f" ({bounds})" if bounds else "")
    return inspect.Parameter(name or e.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[_annotation(e), typer.Option(*flags, help=text, hidden=hidden,
                                                                             show_default=False)])


def _value(e: Entry, v: Any) -> Any:
    if v is None:
        return None
    if e.type == tuple[str, ...]:
        return tuple(v)
    if e.type is not str and _annotation(e) == str | None:
        try:
            return parse_filter(json.loads(v))
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{flag(e.name)}: not JSON ({err})", field=e.name) from None
    return v


def given_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The options' values by parameter name, a deprecated name's moved to its parameter's (both
    given and differing: InvalidInput naming the new flag)."""
    out: dict[str, Any] = {}
    for e in entries(cls):
        if e.name not in values:
            continue
        v = _value(e, values[e.name])
        for alias in e.param.aliases:
            old = values.get(alias)
            if old is None:
                continue
            if v is not None and v != old:
                raise InvalidInput(f"{flag(alias)} is a deprecated name of {flag(e.name)} and the two differ "
                                   f"({old} vs {v}): give {flag(e.name)} only", field=alias)
            v = old
        out[e.name] = v
    return out


def table_options(cls: type, *names: str, help: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Add parameters `names` of `cls` (all its options when none) to a typer command as options; the
    command receives their values in its `given` argument (softknn.common.table.fill's)."""
    chosen = [entry(cls, n) for n in names] if names else [e for e in entries(cls) if e.param.option]
    texts = help or {}

    def decorate(fn: F) -> F:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "given"]
        added = [option(e, help=texts.get(e.name)) for e in chosen]
        added += [option(e, hidden=True, name=a, help=f"deprecated: use {flag(e.name)}")
                  for e in chosen for a in e.param.aliases]
        taken = {p.name for p in added}

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            values = {n: kw.pop(n) for n in taken}
            try:
                given = given_values(cls, values)
            except SoftKNNError as e:
                fail(e)
            return fn(**kw, given=given)

        command.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
        command.__annotations__ = {}  # the signature carries them, evaluated
        del command.__wrapped__  # type: ignore[attr-defined]  # typer reads __signature__, not the wrapped function's
        return command  # type: ignore[return-value]

    return decorate
