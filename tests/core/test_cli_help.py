"""Every `softknn` command answers --help."""

import pytest
from typer.testing import CliRunner

from softknn.cli import app

runner = CliRunner()


def _commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_the_cli_has_the_documented_commands():
    assert {"build", "verify", "info", "query", "sample-kb"} <= set(_commands())


@pytest.mark.parametrize("command", [None] + _commands())
def test_help_on_every_command(command):
    args = [command, "--help"] if command else ["--help"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
