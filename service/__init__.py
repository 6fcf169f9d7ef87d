"""softknn's HTTP service: `create_app(settings)` builds the FastAPI app (see service.app)."""

__all__ = ["create_app"]


def __getattr__(name: str):
    # lazy (PEP 562): `softknn --help` and the CLI's argument checks import service.cli, which must
    # not pull FastAPI, torch and the model code in before there is anything to serve (issue 17)
    if name == "create_app":
        from service.app import create_app

        return create_app
    raise AttributeError(f"module 'service' has no attribute {name!r}")
