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

    from softknn.settings import Settings, apply_threads

    before, before_faiss = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        assert apply_threads(Settings(), serving=True) == 1 == torch.get_num_threads() == faiss.omp_get_max_threads()
        assert apply_threads(Settings()) == (os.cpu_count() or 1) == torch.get_num_threads()
        assert apply_threads(Settings(model={"threads": 3}), serving=True) == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        faiss.omp_set_num_threads(before_faiss)
