"""softknn's HTTP service: `create_app(settings)` builds the FastAPI app (see service.app).

`create_app` loads service.app (and FastAPI) on first use, so `softknn`'s other commands, which
import service.cli to register `serve`, never import FastAPI (tests/test_layering.py checks it).
"""

__all__ = ["create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from service.app import create_app

        return create_app
    raise AttributeError(f"module 'service' has no attribute {name!r}")
