"""softknn's HTTP service: `create_app(settings)` builds the FastAPI app (see service.app)."""

from service.app import create_app

__all__ = ["create_app"]
