"""Fixtures of the reliability tests: real servers, a second bundle, figures.

Two kinds of live server, both real uvicorn over real sockets on 127.0.0.1:
  * `threaded_server(settings)`: uvicorn in a thread of this process, sharing the session's model
    (fast: no model load); for the unmarked tests.
  * `tests.harness.LiveServer.start(...)`: `python -m softknn.service.cli` as its own process (RSS,
    signals, crashes are its own); for the slow tests and the bench scripts.
Both come from the one harness, tests/harness.py.
Figures (JSON) go to artifacts/reliability/; docs/reliability.md quotes them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.params import Settings
from softknn.service.app import create_app
from tests.harness import ADMIN_TOKEN, API_KEY
from tests.harness import threaded_server as serve_in_thread

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "reliability"

# A second, small labelled KB (12 chunks): the other side of every bundle swap.
SMALL_KB = [
    ("rel-01", "Dogs must stay on a lead on the car deck and in the outdoor seating areas.", "pets"),
    ("rel-02", "Cats travel in a closed carrier; the carrier stays with you in the lounge.", "pets"),
    ("rel-03", "Guide dogs are welcome everywhere on board, including the cafe.", "pets"),
    ("rel-04", "A refund is paid within five working days to the card used for the booking.", "refunds"),
    ("rel-05", "Cancel up to two hours before departure for a full refund of a flexible fare.", "refunds"),
    ("rel-06", "Saver fares can be changed for a fee but are not refunded.", "refunds"),
    ("rel-07", "Sailings are cancelled when the wind is forecast above force eight.", "weather"),
    ("rel-08", "In fog the crossing is slower and departures may be held until it lifts.", "weather"),
    ("rel-09", "Check the status page before leaving home on stormy days.", "weather"),
    ("rel-10", "The cafe serves hot food until thirty minutes before arrival.", "food"),
    ("rel-11", "Vegetarian and gluten-free meals are always on the menu.", "food"),
    ("rel-12", "Drinks from the bar may not be taken onto the open deck.", "food"),
]

QUERIES = [
    "Can I bring my dog on the ferry?",
    "How long does a refund take?",
    "Is the crossing cancelled in a storm?",
    "Where can I eat on board?",
    "I lost my wallet on the boat",
    "What happens to my booking if the sailing is cancelled?",
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="package", autouse=True)
def restore_torch_threads():
    """Apps here set one torch thread (settings.model.threads = 1); give the other packages theirs back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small_kb(tmp_path_factory) -> Path:
    kb = tmp_path_factory.mktemp("reliability_kb") / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in SMALL_KB))
    return kb


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory, encoder, small_kb) -> Path:
    out = tmp_path_factory.mktemp("reliability_bundle") / "small"
    build_bundle(small_kb, out, BuildConfig(), encoder, progress=False)
    return out


def settings_for(bundle: Path | None, **sections) -> Settings:
    """A production-like app: API key and admin token set, one torch thread, sections overridden."""
    base: dict = {"bundle": bundle, "model": {"threads": 1},
                  "auth": {"api_key": API_KEY, "admin_token": ADMIN_TOKEN}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return Settings(**base)


@pytest.fixture(scope="session")
def threaded_server(encoder):
    """threaded_server(settings): a context manager yielding an httpx.Client (API key set) on a real
    uvicorn server in a thread of this process, sharing the session's model; ready when yielded."""

    @contextlib.contextmanager
    def run(settings: Settings) -> Iterator[httpx.Client]:
        with serve_in_thread(create_app(settings, encoder=encoder), headers=bearer(API_KEY)) as client:
            yield client

    return run


@pytest.fixture(scope="session")
def write_figure():
    """write_figure(name, data): artifacts/reliability/<name>.json (pretty, sorted); returns the path."""

    def write(name: str, data: dict) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(f"\n{name}: {json.dumps(data, sort_keys=True)}")
        return path

    return write
