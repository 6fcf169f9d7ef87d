"""The one server harness (tests/harness.py): readiness, early exits and timeouts, told exactly."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.harness import REPO, bound_socket, free_port, wait_ready


def test_wait_ready_reports_a_server_that_exited_with_its_code_and_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("boom: the bundle is missing\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(30)
    with httpx.Client(base_url=f"http://127.0.0.1:{free_port()}") as client, pytest.raises(RuntimeError) as e:
        wait_ready(client, 30, proc=proc, log_path=log)
    assert str(e.value) == "server exited with 3; log:\nboom: the bundle is missing\n"


def test_wait_ready_times_out_with_the_statuses_it_saw():
    with bound_socket() as sock:  # bound, never listening: every probe is refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with httpx.Client(base_url=url) as client, pytest.raises(TimeoutError) as e:
            wait_ready(client, 0.3, interval=0.05)
    assert str(e.value).startswith("not ready after 0.3 s; statuses seen [0, 0")


@pytest.fixture
def scripted_server():
    """A real HTTP server (http.server, in a thread, on a held port) answering GETs with the given
    statuses in turn; yields (base URL, statuses to send, paths seen)."""
    statuses: list[int] = []
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            paths.append(self.path)
            self.send_response(statuses.pop(0) if statuses else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", statuses, paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_wait_ready_returns_the_statuses_until_the_first_200(scripted_server):
    url, statuses, paths = scripted_server
    statuses += [503, 503, 200, 503]
    with httpx.Client(base_url=url) as client:
        assert wait_ready(client, 30, interval=0.0) == [503, 503, 200]
    assert paths == ["/readyz"] * 3


def test_wait_ready_polls_the_path_it_is_given(scripted_server):
    url, _, paths = scripted_server
    with httpx.Client(base_url=url) as client:
        assert wait_ready(client, 30, path="/models") == [200]
    assert paths == ["/models"]


def test_the_scripts_wait_is_the_harness_wait_and_fails_when_the_server_exits(scripted_server, tmp_path):
    """`python -m tests.harness wait-ready` (scripts/load_smoke.sh's wait): 0 at the first 200; 1 with the
    pid and the log's tail as soon as the watched process is gone."""
    url, statuses, paths = scripted_server
    statuses += [503, 200]
    ok = subprocess.run([sys.executable, "-m", "tests.harness", "wait-ready", url, "--timeout", "30"],
                        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (ok.returncode, paths) == (0, ["/readyz", "/readyz"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    log = tmp_path / "server.log"
    log.write_text("it died\n")
    with bound_socket() as sock:
        dead = subprocess.run([sys.executable, "-m", "tests.harness", "wait-ready",
                               f"http://127.0.0.1:{sock.getsockname()[1]}", "--pid", str(gone.pid),
                               "--log", str(log), "--timeout", "30"], capture_output=True, text=True, timeout=60,
                              cwd=REPO)
    assert dead.returncode == 1
    assert dead.stderr == f"error: server (pid {gone.pid}) exited; log:\nit died\n\n"
