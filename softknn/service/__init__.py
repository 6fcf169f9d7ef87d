"""softknn's HTTP service: `create_app(settings)` builds the FastAPI app (see softknn.service.app).

`create_app` loads softknn.service.app (and FastAPI) on first use, so `softknn`'s other commands, which
import softknn.service.cli to register `serve`, never import FastAPI (tests/test_layering.py checks it).
"""

__all__ = ["create_app"]


def __getattr__(name: str):
    # lazy (PEP 562): `softknn --help` and the CLI's argument checks import softknn.service.cli, which must
    # not pull FastAPI, torch and the model code in before there is anything to serve
    if name == "create_app":
        from softknn.service.app import create_app

        return create_app
    raise AttributeError(f"module 'softknn.service' has no attribute {name!r}")
