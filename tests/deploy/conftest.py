"""Fixtures of the deployment tests: the generated client (clients/python) against the real app,
in process (a TestClient under the client) and as a real `softknn serve` process.

The client is used from the project venv when installed (`pip install -e ./clients/python`), else
from the source tree (its dependencies, httpx and attrs, are in the `test` extra)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from tests.harness import LiveServer, wait_ready

REPO = Path(__file__).resolve().parents[2]
try:
    import softknn_client  # noqa: F401
except ImportError:  # not installed: the committed sources
    sys.path.insert(0, str(REPO / "clients" / "python"))
try:
    import softknn_integrations  # noqa: F401
except ImportError:  # not installed (`pip install -e ./clients/integrations`): the sources
    sys.path.insert(0, str(REPO / "clients" / "integrations"))


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """One intra-op thread while these tests run (the shared 2-core box; as tests/service does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def inproc_app(encoder, sample_bundle_path):
    """A TestClient (an httpx.Client) over create_app on the sample bundle, lifespan running, ready."""
    from softknn.params import Settings
    from softknn.service.app import create_app

    settings = Settings(bundle=sample_bundle_path, model={"threads": 1})
    with TestClient(create_app(settings, encoder=encoder)) as tc:
        wait_ready(tc, 60)
        yield tc


@pytest.fixture(scope="session")
def inproc_client(inproc_app):
    """The generated client, its HTTP going to the in-process app."""
    from softknn_client import AuthenticatedClient

    return AuthenticatedClient(base_url=str(inproc_app.base_url), token="none").set_httpx_client(inproc_app)


@contextlib.contextmanager
def serve(bundle: Path, log_path: Path):
    """`python -m softknn.service.cli --bundle B --port P` (the project venv's, tests.harness.LiveServer,
    no auth) on 127.0.0.1; yields its base URL once ready."""
    with LiveServer.start(bundle, log_path, auth=False, ready_timeout=180.0) as srv:
        yield srv.url
