"""A Ray cluster of a test's own on one machine: `ray start --block` nodes, each in its own process
group, stopped by that group (never `ray stop`, which stops every Ray process of the machine).

Token authentication stays on, as in a deployment (docker-compose.yml sets RAY_AUTH_MODE=token):
the cluster gets a random token of its own through RAY_AUTH_TOKEN, which every process started with
`ray_env()` (the nodes, `ray status`, `softknn build --ray`, `softknn serve --ray`) presents; nothing
is written under ~/.ray and no other cluster's token is read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.harness import free_port

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this interpreter
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--metrics-export-port", "--runtime-env-agent-port",
              "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port")


def ray_env(**extra: str) -> dict[str, str]:
    """This process's environment, HF offline, with token authentication and a fresh token."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex, **extra}


def start_node(*args: str, temp_dir: str | Path, env: dict[str, str]) -> subprocess.Popen:
    """`ray start --block ARGS` on free ports in a new session (its own process group: `stop_node`
    stops that node and the processes it started, nothing else); output in TEMP_DIR/node-PID.log."""
    cmd = [*RAY, "start", "--block", "--disable-usage-stats", "--temp-dir", str(temp_dir), *args]
    for p in NODE_PORTS:
        cmd += [p, str(free_port())]
    log = Path(temp_dir) / f"node-{time.monotonic_ns()}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def node_log(proc: subprocess.Popen) -> str:
    return Path(proc.log_path).read_text(errors="replace")[-4000:]  # type: ignore[attr-defined]


def stop_node(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM to the node's process group (`ray start --block` stops its node on it), SIGKILL to
    the group after `timeout`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    try:  # anything of the group still there (the node's own children included)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for_cpus(address: str, cpus: float, nodes: list[subprocess.Popen], env: dict[str, str],
                  timeout: float = 240.0) -> str:
    """Poll `ray status --address` until the cluster has `cpus` CPUs; its output. Fails when a node
    exits first or after `timeout` s."""
    deadline, out = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        for n in nodes:
            assert n.poll() is None, node_log(n)
        r = subprocess.run([*RAY, "status", "--address", address], capture_output=True, text=True, env=env,
                           timeout=120)
        out = r.stdout + r.stderr
        if r.returncode == 0 and f"/{cpus:.1f} CPU" in r.stdout:
            return r.stdout
        time.sleep(1)
    raise AssertionError(f"no {cpus} CPUs at {address} after {timeout} s:\n{out[-3000:]}")
