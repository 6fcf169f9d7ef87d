"""softknn.service.cli.serve as a typer command (softknn/cli.py registers it as `softknn serve`)."""

from __future__ import annotations

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
