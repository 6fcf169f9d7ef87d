"""What every command shares (softknn/cli.py, softknn/evaluation/cli.py): the error exit, the
preconditions checked before anything loads. Its own module so the command modules import it, never
each other; their Settings come from softknn.params.settings_from, their encoder from
softknn.model.runtime.encoder_for, their parameters' options from softknn.common.options."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import NoReturn

import typer


def fail(e: Exception | str) -> NoReturn:
    """Print the error in red on stderr and exit with status 2."""
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def need_bundle(path: Path) -> None:
    """Fail fast, before the model or torch loads, when PATH is not a bundle folder."""
    if not path.exists():
        fail(f"{path}: no such bundle folder (build one with `softknn build KB --out {path}`)")
    if not (path / "manifest.json").is_file():
        fail(f"{path}: not a bundle (no manifest.json)")


def need_ray() -> None:
    """`--ray` without Ray installed: say how to get it (it is an extra), not an ImportError."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        fail("--ray needs Ray, an optional extra: pip install -e '.[ray]' (or the CPU image, which carries it)")


def sample_kb_path() -> Path:
    """The bundled sample KB (an original fictional ferry-cooperative text)."""
    return Path(str(resources.files("softknn") / "sample_kb" / "kb"))
