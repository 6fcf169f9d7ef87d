"""Shared fixtures of the service tests: real bundles, in-process apps and real uvicorn processes,
session-scoped where they are costly. The model and the sample bundle come from tests/conftest.py.

In-process apps share the session's model (create_app(settings, encoder=...)); every app and
server runs one torch thread (the 2-core box is shared). Real server processes come from the one
harness, tests/harness.py."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from softknn.cli import sample_kb_path
from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.infer.results import InferResult
from softknn.params import Settings
from softknn.service.app import create_app
from softknn.storage.layout import version_id
from tests.harness import LiveServer, wait_ready
from tests.numerics import close

REPO = Path(__file__).resolve().parents[2]
ADMIN = "admin-token-for-tests"
API_KEY = "api-key-for-tests"
TOL = 1e-5
MAX_K = 512  # above the sample KB's 297 chunks, so an exact k = N request is allowed

# A second, small labelled KB: its chunk ids never collide with the sample's.
SMALL_KB = [
    ("small-01", "Dogs must stay on a lead on the car deck and in the outdoor seating areas.", "pets"),
    ("small-02", "Cats travel in a closed carrier; the carrier stays with you in the lounge.", "pets"),
    ("small-03", "Guide dogs are welcome everywhere on board, including the cafe.", "pets"),
    ("small-04", "A refund is paid within five working days to the card used for the booking.", "refunds"),
    ("small-05", "Cancel up to two hours before departure for a full refund of a flexible fare.", "refunds"),
    ("small-06", "Saver fares can be changed for a fee but are not refunded.", "refunds"),
    ("small-07", "Sailings are cancelled when the wind is forecast above force eight.", "weather"),
    ("small-08", "In fog the crossing is slower and departures may be held until it lifts.", "weather"),
    ("small-09", "Check the status page before leaving home on stormy days.", "weather"),
    ("small-10", "The cafe serves hot food until thirty minutes before arrival.", "food"),
    ("small-11", "Vegetarian and gluten-free meals are always on the menu.", "food"),
    ("small-12", "Drinks from the bar may not be taken onto the open deck.", "food"),
]


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """One intra-op thread while these tests run, as every app here asks for (settings.model.threads
    = 1): two on the shared 2-core box oversubscribe it. Restored for the other test packages."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


# The model (`encoder`), the sample bundle (`sample_bundle_path`) and an `engine` over it come from
# tests/conftest.py, shared with the other test packages.
@pytest.fixture(scope="session")
def bundle_dir(sample_bundle_path) -> Path:
    return sample_bundle_path


@pytest.fixture(scope="session")
def bundle_b(tmp_path_factory, encoder) -> Path:
    root = tmp_path_factory.mktemp("small_kb")
    kb = root / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in SMALL_KB))
    out = root / "bundle"
    build_bundle(kb, out, BuildConfig(), encoder, progress=False)
    return out


@pytest.fixture(scope="session")
def queries() -> list[str]:
    kb = sample_kb_path().parent
    return [json.loads(line)["text"] for name in ("queries.jsonl", "ood_queries.jsonl")
            for line in (kb / name).read_text().splitlines() if line.strip()]


def settings_for(bundle: Path | None, **sections) -> Settings:
    """Settings for a test app: one torch thread, the admin token set, sections overridden."""
    base = {"bundle": bundle, "model": {"threads": 1}, "auth": {"admin_token": ADMIN}, "limits": {"max_k": MAX_K}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return Settings(**base)


@pytest.fixture(scope="session")
def make_settings(bundle_dir):
    def make(bundle: Path | None | str = "sample", **sections) -> Settings:
        return settings_for(bundle_dir if bundle == "sample" else bundle, **sections)

    return make


@pytest.fixture(scope="session")
def running_app(encoder):
    """running_app(settings, ready=True): a context manager yielding a TestClient whose lifespan
    (model shared, bundle loaded, worker thread) runs; waits for /readyz when `ready`."""

    @contextlib.contextmanager
    def run(settings: Settings, *, ready: bool = True):
        with TestClient(create_app(settings, encoder=encoder)) as client:
            if ready:
                wait_ready(client, 60)
            yield client

    return run


@pytest.fixture(scope="session")
def inproc(running_app, make_settings):
    with running_app(make_settings()) as client:
        yield client


@contextlib.contextmanager
def uvicorn_process(bundle: Path, log_path: Path, env: dict[str, str]):
    """`python -m softknn.service.cli --bundle B --port P` as a real process (tests.harness.LiveServer, no
    auth unless `env` sets it); yields (client, statuses seen while it got ready)."""
    with LiveServer.start(bundle, log_path, env={"SOFTKNN_LIMITS__MAX_K": str(MAX_K), **env}, auth=False,
                          ready_timeout=180.0) as srv:
        yield srv.client, srv.ready_statuses


@pytest.fixture(scope="session")
def server(tmp_path_factory, bundle_dir):
    """A real server: open /v1/*, admin token set, default limits."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with uvicorn_process(bundle_dir, log, {"SOFTKNN_AUTH__ADMIN_TOKEN": ADMIN}) as (client, seen):
        client.ready_statuses = seen
        client.log_path = log
        yield client


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory, bundle_dir):
    """A real server with an API key, an admin token and a one-text queue (429s come easily)."""
    log = tmp_path_factory.mktemp("auth_server") / "server.log"
    env = {"SOFTKNN_AUTH__ADMIN_TOKEN": ADMIN, "SOFTKNN_AUTH__API_KEY": API_KEY,
           "SOFTKNN_BATCHING__QUEUE_SIZE": "1", "SOFTKNN_BATCHING__MAX_BATCH_SIZE": "1",
           "SOFTKNN_BATCHING__MAX_WAIT_MS": "0"}
    with uvicorn_process(bundle_dir, log, env) as (client, _):
        client.api_key, client.admin_token = API_KEY, ADMIN
        yield client


@pytest.fixture(params=["inproc", "http"])
def api(request) -> httpx.Client:
    """The same tests in process (TestClient) and over real HTTP (uvicorn)."""
    return request.getfixturevalue("inproc" if request.param == "inproc" else "server")


# --- copies of a bundle that must be refused ------------------------------------------------------
def corrupt_copy(src: Path, dst: Path) -> Path:
    """A copy with one byte flipped in the stored memory (the default `hidden`: its states; checksums no longer match)."""
    shutil.copytree(src, dst)
    target = dst / "mem_hidden.npy"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return dst


def foreign_copy(src: Path, dst: Path) -> Path:
    """A self-consistent copy that claims other model weights (as if built with another model)."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["model"]["fingerprint"] = "0" * 64
    m["version_id"] = version_id(m)
    (dst / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True))
    return dst


@pytest.fixture
def refused_bundles(tmp_path, bundle_dir):
    return {"corrupt": corrupt_copy(bundle_dir, tmp_path / "corrupt"),
            "foreign": foreign_copy(bundle_dir, tmp_path / "foreign")}


# --- comparing a service result with the engine's ---------------------------------------------------
def _close(a, b, path: str, tol: float) -> None:
    if isinstance(b, dict):
        assert isinstance(a, dict) and set(b) <= set(a), (path, sorted(a), sorted(b))
        if path.endswith(".sources"):  # the service knows where each value came from; an engine run directly, only
            assert b.items() <= a.items(), (path, a, b)  # what the bundle filled in
            return
        for key in set(a) - set(b):  # keys the service adds are the optional ones, null
            assert a[key] is None, (path, key)
        for key in b:
            if key == "query_tokens":
                _query_tokens(a[key], b[key], f"{path}.{key}", tol)
            else:
                _close(a[key], b[key], f"{path}.{key}", tol)
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]", tol)
    elif isinstance(b, float) and not isinstance(a, bool):
        assert math.isfinite(a) and close(a, b, tol), (path, a, b)  # tests/numerics.py: relative above 1
    else:
        assert a == b, (path, a, b)


def _query_tokens(a: list[dict], b: list[dict], path: str, tol: float) -> None:
    """Ranked query tokens: same weights; the same tokens where the ranking is not a tie.

    In fixed mixing every query token puts the same mass (1−α)·w_c on a chunk, so the ranking is a
    tie broken by float round-off, which differs between a padded batch and a solo run. Only the
    weights, and the identity of items whose weight stands apart by more than tol (the last item
    may tie with an unlisted token), are determined."""
    assert len(a) == len(b), (path, a, b)
    wa, wb = [t["weight"] for t in a], [t["weight"] for t in b]
    for i, (x, y) in enumerate(zip(wa, wb, strict=True)):
        assert close(x, y, tol), (path, i, x, y)
    for i, t in enumerate(b):
        others = wb[:i] + wb[i + 1 :]
        if i < len(b) - 1 and all(abs(t["weight"] - w) > tol for w in others):
            _close(a[i], t, f"{path}[{i}]", tol)


@pytest.fixture(scope="session")
def assert_same():
    """assert_same(service_result, engine_result, tol=1e-5)."""

    def check(a: dict, b: dict | InferResult, tol: float = TOL) -> None:
        _close(a, b.to_dict() if isinstance(b, InferResult) else b, "result", tol)

    return check
