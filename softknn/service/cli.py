"""`softknn serve`: build Settings (environment, then these options) and run uvicorn on create_app.

Registered in softknn/cli.py as the `serve` command; also runnable as `python -m softknn.service.cli`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer


def split_bundles(values: list[str]) -> tuple[Path | str | None, dict[str, Path | str]]:
    """--bundle values: (the plain DIR or URI, if one; {NAME: DIR or URI} of the NAME=… ones). NAME=DIR
    needs a valid KB name before the first '=' (no '/': so ./a=b is a directory). A URI
    (s3://bucket/kb) stays a string (softknn.storage.remote)."""
    from softknn.common.kb_names import KB_NAME  # not softknn.params: it imports numpy
    from softknn.common.location import is_remote

    def location(v: str) -> Path | str:
        return v if is_remote(v) else Path(v)

    plain: Path | str | None = None
    named: dict[str, Path | str] = {}
    for v in values:
        name, eq, path = v.partition("=")
        if eq and KB_NAME.fullmatch(name):
            if name in named:
                raise typer.BadParameter(f"two bundles for the KB {name!r}", param_hint="--bundle")
            named[name] = location(path)
        elif plain is not None:
            raise typer.BadParameter(f"two plain bundles ({plain}, {v}): name them NAME=DIR",
                                     param_hint="--bundle")
        else:
            plain = location(v)
    return plain, named


def serve(
    bundle: Annotated[list[str] | None, typer.Option("--bundle", help="bundle directory to serve (SOFTKNN_BUNDLE), "
                                                       "or NAME=DIR, repeated, for several named KBs "
                                                       "(SOFTKNN_BUNDLES); a plain DIR is the KB named default")] = None,
    host: Annotated[str | None, typer.Option(help="interface to bind (SOFTKNN_HOST, default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (SOFTKNN_PORT, default 8000)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="sentence-transformers model path "
                                                 "(SOFTKNN_MODEL__NAME; default: packaged all-MiniLM-L6-v2)")] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="debug | info | warning | error")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="serve on Ray: one actor per shard of a sharded bundle, "
                                      "the model as a Ray Serve deployment (softknn.service.ray)")] = False,
    address: Annotated[str | None, typer.Option("--address", help="with --ray: the Ray cluster to join "
                                                   "(e.g. auto, HOST:6379); default: start a local one")] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="with --ray: model replicas")] = 1,
    shard_resources: Annotated[str | None, typer.Option("--shard-resources", help="with --ray: Ray resources "
                                                           "each shard actor needs, JSON, e.g. '{\"shard\": 1}' "
                                                           "(default: spread over the nodes)")] = None,
    shard_replicas: Annotated[int, typer.Option("--shard-replicas", min=1, help="with --ray: actors per shard, "
                                                "on distinct nodes where there are enough; a request goes "
                                                "to a live copy")] = 1,
    wait_nodes: Annotated[int, typer.Option("--wait-nodes", min=1, help="with --ray: start serving once the "
                                            "cluster has this many live nodes, the head included (shards are "
                                            "placed then); exit 2 after --wait-nodes-timeout")] = 1,
    wait_nodes_timeout: Annotated[float, typer.Option("--wait-nodes-timeout", min=0,
                                                      help="with --ray: seconds --wait-nodes waits")] = 300.0,
    ingress: Annotated[str, typer.Option("--ingress", help="with --ray: proxy (Serve's Python proxy) | haproxy "
                                         "(Ray Serve's HAProxy ingress, straight to the replicas' own HTTP "
                                         "servers: docs/scale.md)")] = "proxy",
) -> None:
    """Serve a bundle over HTTP: POST /v1/infer, GET /v1/index, /healthz, /readyz, /metrics, /docs.

    Every other setting is a SOFTKNN_* environment variable (see the table in docs/usage.md), e.g.
    SOFTKNN_AUTH__API_KEY, SOFTKNN_MODEL__THREADS, SOFTKNN_BATCHING__QUEUE_SIZE.
    """
    # Before torch (and its OpenMP) loads: OpenMP threads waiting at a barrier sleep instead of
    # spinning, which on a busy box takes the core the event loop needs (docs/benchmarks.md,
    # contention: 13.9x a plain encode's p50 beside a CPU hog with 2 spinning threads, 0.42x passive).
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    plain, named = split_bundles(bundle or [])
    given = [*([plain] if plain is not None else []), *named.values()]
    if not given and os.environ.get("SOFTKNN_BUNDLE"):
        given = [os.environ["SOFTKNN_BUNDLE"]]
    if given:  # answered before FastAPI, torch and the model load
        from softknn.common.console import need_bundle
        from softknn.common.location import is_remote

        for path in given:
            if not is_remote(path):  # a URI is read by the service (its errors exit it, with the reason)
                need_bundle(Path(path))
    import uvicorn
    from pydantic import ValidationError

    from softknn.params import Settings
    from softknn.service.app import create_app
    from softknn.service.logs import configure_logging
    from softknn.service.server import uvicorn_config

    overrides = {"bundle": plain, "bundles": named or None, "host": host, "port": port, "log_level": log_level}
    # the given options as Settings' keyword arguments (pydantic validates them; the environment fills the rest)
    init: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if model is not None:
        init["model"] = {"name": model}  # merged with SOFTKNN_MODEL__* from the environment
    try:
        settings = Settings(**init)
        app = create_app(settings)
    except (ValidationError, ValueError) as e:
        typer.secho(f"error: invalid settings: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    configure_logging(settings.log_level)
    if ray:
        import json

        if len(settings.kbs()) > 1:
            typer.secho("error: --ray serves one KB: several named bundles are not served on Ray yet",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(2)

        from softknn.service.ray.launcher import INGRESS_ENV

        if ingress not in INGRESS_ENV:
            typer.secho(f"error: --ingress must be one of {', '.join(INGRESS_ENV)}, got {ingress!r}",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(2)
        from softknn.common.console import need_ray

        need_ray()
        from softknn.service.ray.launcher import serve_ray

        try:
            resources = json.loads(shard_resources) if shard_resources else None
        except json.JSONDecodeError as e:
            typer.secho(f"error: --shard-resources is not JSON: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        from softknn.service.ray.launcher import NotEnoughNodes

        try:
            serve_ray(settings, address=address, replicas=replicas, shard_resources=resources,
                      shard_replicas=shard_replicas, min_nodes=wait_nodes, nodes_timeout_s=wait_nodes_timeout,
                      ingress=ingress)
        except (NotEnoughNodes, ValueError) as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        return
    if (address is not None or replicas != 1 or shard_resources is not None or shard_replicas != 1
            or wait_nodes != 1 or ingress != "proxy"):
        typer.secho("error: --address, --replicas, --shard-resources, --shard-replicas, --wait-nodes and --ingress "
                    "need --ray",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    # the lingering close: a client still sending when it is answered (408, 413) reads its answer, not a reset
    server = uvicorn.Server(uvicorn_config(app, host=settings.host, port=settings.port,
                                           log_level=settings.log_level.lower(), timeout_graceful_shutdown=10))
    failed: list[str] = []

    def stop(reason: str) -> None:
        """The model or the bundle given at start-up did not open: nothing to serve, so say why on
        stderr and exit non-zero (as TEI does) for a supervisor to see. A bundle that fails a later
        POST /v1/admin/reload leaves the one serving in place instead."""
        failed.append(reason)
        typer.secho(f"error: start-up failed, exiting: {reason}", fg=typer.colors.RED, err=True)
        server.should_exit = True

    app.state.kbs.on_failed_start = stop
    server.run()
    if failed:
        raise typer.Exit(2)


if __name__ == "__main__":  # pragma: no cover
    typer.run(serve)
