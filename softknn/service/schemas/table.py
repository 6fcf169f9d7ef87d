"""Request fields derived from the parameter table (softknn.common.table): one per parameter a route
takes, unset (null) by default, with the table's type, bounds, choices and description. What a
request leaves unset is filled by the one step every door shares (softknn.params.infer_params,
gen_params): the settings, then the bundle.

A parameter the core never takes as None (alpha, mixing, ...) is not nullable in the schema: a
request leaves it out to leave it unset. A bound a server's settings set (limits.max_k, limits.max_evidence, generator.max_tokens; the texts'
count and length) cannot be in a static schema: its description says it, and a validator checks it
against the serving app's settings (`app_settings`), which the routes' `bind_settings` dependency
sets for each request before its body is validated.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, create_model
from pydantic_core import PydanticCustomError

from softknn.common.filters import CheckedFilter
from softknn.common.table import Entry, entries, entry
from softknn.params import Settings, limit
from softknn.service.schemas.common import Stop, integral

_SETTINGS: ContextVar[Settings | None] = ContextVar("softknn_app_settings", default=None)
_DEFAULTS: list[Settings] = []  # outside a request (a model validated directly): the settings' own defaults


def bind(settings: Settings) -> None:
    """The settings this request's body is validated against (the serving app's)."""
    _SETTINGS.set(settings)


def app_settings() -> Settings:
    s = _SETTINGS.get()
    if s is not None:
        return s
    if not _DEFAULTS:
        _DEFAULTS.append(Settings.model_construct())
    return _DEFAULTS[0]


def limit_of(path: str, settings: Settings | None = None) -> int:
    """The value of setting `path` ("limits.max_k") in the serving app's settings."""
    return limit(settings or app_settings(), path)


def at_most(path: str):
    """A validator: the value is at most setting `path` of the serving app (pydantic's own error)."""

    def check(v: Any) -> Any:
        if v is not None and v > (limit := limit_of(path)):
            raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}", {"le": limit})
        return v

    return AfterValidator(check)


def limit_text(path: str) -> str:
    default = limit_of(path, Settings.model_construct())
    return f"; at most the server's {path} ({default} by default)"


def _type(e: Entry) -> list[Any]:
    """The request's type of parameter `e` as [type, annotations...]: strict JSON types (an integer may
    be sent as 4.0; its bounds before that conversion, so the schema's integer carries them), a string
    or a list of strings for a stop list, the filter tree for a filter."""
    bounds = [Field(**e.param.bounds())] if e.param.bounds() else []  # type: ignore[call-overload]
    if e.type is int:
        return [int, *bounds, BeforeValidator(integral)]
    if e.type == tuple[str, ...]:
        return [Stop]
    if e.choices is None and e.type not in (bool, float, str):
        return [CheckedFilter]
    return [e.type, *bounds]


def request_field(e: Entry, name: str | None = None, description: str | None = None,
                  nullable: bool = False) -> tuple[Any, Any]:
    """(annotation, FieldInfo) of parameter `e` as a request field (`name`: a deprecated name of it;
    `nullable`: null accepted, as leaving it out, where the core never takes None)."""
    t = _type(e)
    text = description or e.param.description
    if e.param.setting and e.default is not None and e.default != ():
        text += f"; left out: the server's setting, {e.default} by default"
    if e.param.limit is not None:
        t.append(at_most(e.param.limit))
        text += limit_text(e.param.limit)
    ann = Annotated[tuple(t)] if len(t) > 1 else t[0]  # type: ignore[valid-type]
    if e.optional or nullable:  # null is a value the request may send: unset, as leaving the field out
        ann = ann | None
    extra = {"deprecated": True} if name is not None else {}
    # unset: None, which the schema does not show as a default (the server's settings decide it), and
    # which a request may send only where the parameter takes null
    return ann, Field(None, description=f"deprecated: use {e.name}" if name is not None else text,
                      json_schema_extra=_no_default(extra))


def _no_default(extra: dict[str, Any]):
    def edit(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(extra)

    return edit


def request_fields(cls: type, *names: str, described: Mapping[str, str] | None = None,
                   nullable: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request fields of `cls`'s parameters `names` (every one the table marks a request field
    when none is named), each deprecated name its own field; `described`: texts of this route's own;
    `nullable`: parameters this route takes null for (OpenAI's clients send a null stop or max_tokens)."""
    chosen = [entry(cls, n) for n in names] if names else [e for e in entries(cls) if e.param.request]
    out = {e.name: request_field(e, description=(described or {}).get(e.name), nullable=e.name in nullable)
           for e in chosen}
    out |= {a: request_field(e, name=a) for e in chosen for a in e.param.aliases}
    return out


def given(body: BaseModel, cls: type) -> dict[str, Any]:
    """What a request gives of `cls`'s parameters (None: unset), deprecated names included, by name."""
    names = [n for e in entries(cls) for n in (e.name, *e.param.aliases)]
    return {n: getattr(body, n) for n in names if n in type(body).model_fields}


def derived(name: str, base: type[BaseModel], doc: str, fields: dict[str, Any]) -> type[BaseModel]:
    """The request model `name`: `base`'s own fields and validators, and the table's `fields`."""
    return create_model(name, __base__=base, __doc__=doc, **fields)
