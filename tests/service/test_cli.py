"""softknn.service.cli.serve as a typer command (softknn/cli.py registers it as `softknn serve`)."""

from __future__ import annotations

import os

import typer
from typer.testing import CliRunner


def command() -> typer.Typer:
    from softknn.service.cli import serve

    app = typer.Typer()
    app.command()(serve)
    return app


def test_serve_documents_its_options():
    r = CliRunner().invoke(command(), ["--help"])
    assert r.exit_code == 0
    for option in ("--bundle", "--host", "--port", "--model", "--log-level"):
        assert option in r.output


def test_serve_refuses_invalid_settings_before_starting(monkeypatch):
    monkeypatch.setenv("SOFTKNN_DEFAULTS__K", "1000")  # above limits.max_k (256)
    r = CliRunner().invoke(command(), ["--port", "8123"])
    assert r.exit_code == 2
    assert "invalid settings: defaults.k = 1000 exceeds limits.max_k = 256" in r.output
    monkeypatch.delenv("SOFTKNN_DEFAULTS__K")
    r = CliRunner().invoke(command(), ["--port", "70000"])
    assert r.exit_code == 2
    assert "invalid settings" in r.output and "port" in r.output


def test_serve_makes_openmp_threads_wait_passively_unless_told_otherwise(monkeypatch):
    """Set before torch loads (serve's first step; here refused settings end it right after):
    spinning OpenMP waits took 14x a plain encode's p50 on a busy box (bench/contention.py)."""
    monkeypatch.setenv("SOFTKNN_DEFAULTS__K", "1000")  # refused after the environment is set, before uvicorn
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # restored as they were after the test
        monkeypatch.setenv(name, "")
    for given, want in ({}, "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"), ({"GOMP_SPINCOUNT": "300000"}, None):
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        for k, v in given.items():
            monkeypatch.setenv(k, v)
        assert CliRunner().invoke(command(), ["--port", "8123"]).exit_code == 2
        assert os.environ.get("OMP_WAIT_POLICY") == want, given


def test_threads_default_to_one_per_worker_in_the_service_and_the_cores_elsewhere():
    import faiss
    import torch

    from softknn.model.runtime import apply_threads
    from softknn.params import Settings

    before, before_faiss = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        assert apply_threads(Settings(), serving=True) == 1 == torch.get_num_threads() == faiss.omp_get_max_threads()
        assert apply_threads(Settings()) == (os.cpu_count() or 1) == torch.get_num_threads()
        assert apply_threads(Settings(model={"threads": 3}), serving=True) == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        faiss.omp_set_num_threads(before_faiss)


def test_serve_exits_with_the_reason_on_stderr_when_its_bundle_fails_verification(refused_bundles):
    """A bundle named at start-up that does not verify: nothing to serve, so the process says why on
    stderr (not only in a JSON log line) and exits 2, as TEI does. (A failed POST /v1/admin/reload
    leaves the serving bundle in place: tests/service/test_reload.py.)"""
    import subprocess
    import sys

    from tests.harness import REPO, free_port

    corrupt = refused_bundles["corrupt"]
    r = subprocess.run([sys.executable, "-m", "softknn.service.cli", "--bundle", str(corrupt), "--port", str(free_port())],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "SOFTKNN_MODEL__THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: start-up failed, exiting: BundleError: {corrupt}")
    assert "sha256 mismatch" in lines[0] and "mem_hidden.npy" in lines[0]


def test_the_ray_options_need_ray():
    for given in (["--shard-replicas", "2"], ["--wait-nodes", "3"], ["--replicas", "2"], ["--ingress", "haproxy"]):
        r = CliRunner().invoke(command(), ["--port", "8123", *given])
        assert r.exit_code == 2, (given, r.output)
        assert ("error: --address, --replicas, --shard-resources, --shard-replicas, --wait-nodes and --ingress "
                "need --ray" in r.output), r.output
