"""The app factory. `create_app(settings)` → a FastAPI app; the model and bundle load in its lifespan.

    uvicorn --factory softknn.service.app:app_from_env      (settings from SOFTKNN_* variables)
    softknn serve --bundle DIR                      (softknn.service.cli.serve)
    softknn serve --bundle faq=DIR --bundle regs=DIR2  (several KBs: softknn.service.kbs)

Loading runs in the background (Runtime.start, from the lifespan), so the server answers at once:
/healthz 200, /readyz and /v1/* 503 not_ready until the model, the bundle and a warm-up pass are
done. Shutdown stops admitting, fails what still waits (503) and lets the running batch finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

import softknn
from softknn.model.encoder import Encoder
from softknn.params import DEFAULT_KB, Settings, check_limits
from softknn.service import errors
from softknn.service.auth import require_admin, require_api_key
from softknn.service.deps import bind_settings
from softknn.service.kbs import KBs
from softknn.service.metrics import Metrics
from softknn.service.middleware import BodyLimitMiddleware, RequestContextMiddleware
from softknn.service.routes import (
    admin,
    documents,
    explorer,
    generate,
    health,
    index,
    infer,
    metrics,
    openai,
    rerank,
)
from softknn.service.runtime.core import Runtime

log = logging.getLogger("softknn.service")

DESCRIPTION = """Attention extended, without retraining, to a FAISS-indexed knowledge base: every
output names the KB entries it drew on. Errors: `{"error": {"type", "message", "field"}}`."""


def check_settings(settings: Settings) -> None:
    """Refuse settings whose defaults break their own limits (a request that leaves a parameter unset
    gets the setting, and the limit is checked on what requests send)."""
    lim = settings.limits
    check_limits(settings)
    if lim.max_tokens is not None and lim.max_tokens < 3:
        raise ValueError(f"limits.max_tokens = {lim.max_tokens}: need room for two special tokens and one more")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    kbs: KBs = app.state.kbs
    kbs.first.batcher.start()  # one batcher, shared by every KB
    loading = asyncio.create_task(kbs.start())
    try:
        if kbs.first.cluster is not None:
            # one replica of a Ray Serve deployment: Serve runs this startup inside the replica's
            # initialisation and routes requests only to initialised replicas, so waiting for the
            # load here keeps a replica that is still loading out of rotation (beside a ready one it
            # would answer 503 not_ready). kbs.start() never raises: a replica whose load failed
            # still starts, /readyz reports it and a reload repairs it.
            await loading
        yield
    finally:
        loading.cancel()  # shutdown while loading: stop waiting (a loading thread finishes on its own)
        with contextlib.suppress(asyncio.CancelledError):
            await loading
        await asyncio.to_thread(kbs.first.batcher.close)
        await asyncio.to_thread(kbs.close)
        log.info("stopped")


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operationId: its name (`infer`, `healthz`, ...), not FastAPI's default
    `infer_v1_infer_post`. The generated client (clients/python) names its modules after these, so
    route names must be unique (tests/deploy/test_openapi_drift.py checks) and renaming one is an API change."""
    return route.name


def make_kbs(settings: Settings, metrics: Metrics, *, encoder: Encoder | None = None, shard_backend=None,
             generator=None, cluster=None) -> KBs:
    """One Runtime per KB of settings.kbs(), sharing one model, batcher and generation threads."""
    named = settings.kbs()
    if cluster is not None and len(named) > 1:
        raise ValueError(f"several KBs ({', '.join(named)}) are not served on Ray yet: serve one per deployment")
    first: Runtime | None = None
    runtimes: dict[str, Runtime] = {}
    for name, path in named.items():
        rt = Runtime(settings, metrics, encoder=encoder, shard_backend=shard_backend, generator=generator,
                     cluster=cluster, kb=name, bundle=path, shared=first.shared if first is not None else None)
        first = first or rt
        runtimes[name] = rt
    return KBs(runtimes)


def create_app(settings: Settings, *, encoder: Encoder | None = None, shard_backend=None, generator=None,
               cluster=None, echo_request_id: bool = True) -> FastAPI:
    """The service app. Pass `encoder` to share an already loaded model (tests, several apps), and
    `generator` (softknn.generate.model.Generator) to share a loaded causal LM the same way;
    `shard_backend` opens a sharded bundle's shards elsewhere (softknn.storage.ray_shards.RayShards.factory);
    `cluster` makes the app one replica of a deployment (softknn.service.ray.coordinator.ReplicaLink);
    `echo_request_id=False` when a proxy in front already echoes X-Request-ID (Ray Serve's does)."""
    check_settings(settings)
    # /docs and /redoc with Swagger UI and ReDoc served from fastapi-offline's packaged copy
    # (/static-offline-docs), not a CDN: the API docs work without internet
    app: FastAPI = FastAPIOffline(title="softknn", version=softknn.__version__, description=DESCRIPTION,
                                  lifespan=lifespan, generate_unique_id_function=operation_id)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.kbs = make_kbs(settings, app.state.metrics, encoder=encoder, shard_backend=shard_backend,
                             generator=generator, cluster=cluster)
    # the KB named default (else the first): what a single-KB caller of app.state.runtime means
    app.state.runtime = app.state.kbs.runtimes.get(DEFAULT_KB, app.state.kbs.first)
    errors.install(app)

    app.include_router(health.router)
    app.include_router(metrics.router)
    reader = [Depends(bind_settings), Depends(require_api_key)]  # the settings first: the body's limits read them
    for router in (infer.router, index.router, generate.router, rerank.router, openai.router):
        app.include_router(router, dependencies=reader)
    app.include_router(admin.router, dependencies=[Depends(require_admin)])
    app.include_router(documents.router)  # per route: writes need the admin token, reads the API key
    app.include_router(explorer.router)
    if explorer.STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=explorer.STATIC_DIR), name="static")

    # add_middleware wraps outermost last: request context ⊃ CORS ⊃ body limit ⊃ routes
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.limits.max_body_bytes,
                       timeout_s=settings.limits.body_timeout_s)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST", "PUT", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["X-Request-ID", "Retry-After"])
    app.add_middleware(RequestContextMiddleware, metrics=app.state.metrics, echo=echo_request_id)
    return app


def app_from_env() -> FastAPI:
    """uvicorn --factory entry point: Settings from the environment (SOFTKNN_*)."""
    return create_app(Settings())
