"""Print the settings table of docs/usage.md from softknn.params.Settings (tests check docs/usage.md matches).

    python scripts/settings_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel

# run as a script, this checkout's softknn (not an installed one elsewhere: a git worktree shares the venv)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softknn.params import Settings  # noqa: E402


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, f"{prefix}{name.upper()}__")
            continue
        default = f.get_default(call_default_factory=True)
        shown = "unset" if default is None else (", ".join(default) if isinstance(default, list) else str(default))
        rows.append((f"{prefix}{name.upper()}", f"`{shown or '[]'}`", f.description or ""))
    return rows


def table() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | {d} | {m} |" for n, d, m in _rows(Settings, "SOFTKNN_")]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
