"""FastAPI dependencies as `Annotated` aliases: settings, runtime, engine and request id come from
the app (built by create_app), never from module globals.

All are `async def`: FastAPI runs a plain `def` dependency in its thread pool, and these do no
blocking work: with plain `def`, every request pays one thread-pool hop per dependency, a visible
share of the event loop's time (`python -m bench profile_service --clients 1`; docs/benchmarks.md)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from pydantic import BaseModel

from softknn.infer.engine import Engine
from softknn.params import Settings
from softknn.service.kbs import KBs
from softknn.service.runtime.core import Runtime
from softknn.service.schemas import KB_DOC, bind


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def bind_settings(request: Request) -> None:
    """The app's settings for the request models' limit validators (softknn.service.schemas.table): a
    router dependency, so FastAPI runs it before it validates the body."""
    bind(request.app.state.settings)


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_kbs(request: Request) -> KBs:
    return request.app.state.kbs


async def get_engine(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Engine:
    """The engine serving now; 503 not_ready until the model and a bundle are loaded and warm."""
    return runtime.current()


async def get_request_id(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)  # set by RequestContextMiddleware
    return rid or uuid.uuid4().hex


SettingsDep = Annotated[Settings, Depends(get_settings)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
EngineDep = Annotated[Engine, Depends(get_engine)]
RequestIdDep = Annotated[str, Depends(get_request_id)]
KBsDep = Annotated[KBs, Depends(get_kbs)]
KBQuery = Annotated[str | None, Query(min_length=1, max_length=256, description=KB_DOC)]


Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def body_model(model: type[BaseModel], param: str = "body") -> Callable[[Endpoint], Endpoint]:
    """Under a route decorator: FastAPI validates the endpoint's `param` against `model`, a request
    model whose parameter fields are derived from the parameter table (schemas.InferRequest and the
    like). The endpoint annotates `param` with the model's base class (schemas.InferBody, ...), the
    static type a type checker can read; the model must subclass it."""

    def annotate(endpoint: Endpoint) -> Endpoint:
        base = endpoint.__annotations__[param]
        if not issubclass(model, base):
            raise TypeError(f"{model.__name__} does not subclass {base.__name__}, the type of {param!r}")
        endpoint.__annotations__[param] = model
        return endpoint

    return annotate
