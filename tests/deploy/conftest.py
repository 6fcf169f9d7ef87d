"""Fixtures of the deployment tests: the generated client (clients/python) against the real app,
in process (a TestClient under the client) and as a real `softknn serve` process.

The client is used from the project venv when installed (`pip install -e ./clients/python`), else
from the source tree (its dependencies, httpx and attrs, are in the `test` extra)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]
try:
    import softknn_client  # noqa: F401
except ImportError:  # not installed: the committed sources
    sys.path.insert(0, str(REPO / "clients" / "python"))


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """One intra-op thread while these tests run (the shared 2-core box; as tests/service does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def wait_ready(get, timeout: float) -> None:
    """Poll get('/readyz') until 200 (connection errors count as not ready)."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            last = get("/readyz").status_code
            if last == 200:
                return
        except httpx.TransportError as e:
            last = repr(e)
        time.sleep(0.1)
    raise TimeoutError(f"not ready after {timeout} s (last: {last})")


@pytest.fixture(scope="session")
def inproc_app(encoder, sample_bundle_path):
    """A TestClient (an httpx.Client) over create_app on the sample bundle, lifespan running, ready."""
    from service.app import create_app
    from softknn.settings import Settings

    settings = Settings(bundle=sample_bundle_path, model={"threads": 1})
    with TestClient(create_app(settings, encoder=encoder)) as tc:
        wait_ready(tc.get, 60)
        yield tc


@pytest.fixture(scope="session")
def inproc_client(inproc_app):
    """The generated client, its HTTP going to the in-process app."""
    from softknn_client import AuthenticatedClient

    return AuthenticatedClient(base_url=str(inproc_app.base_url), token="none").set_httpx_client(inproc_app)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(bundle: Path, log_path: Path):
    """`softknn serve --bundle B --port P` (the project venv's), on 127.0.0.1; yields its base URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1"}
    cmd = [sys.executable, "-m", "service.cli", "--bundle", str(bundle), "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            try:
                wait_ready(c.get, 180)
            except TimeoutError:
                raise RuntimeError(f"server not ready; log:\n{log_path.read_text()[-4000:]}") from None
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
