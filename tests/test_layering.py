"""One installed package, `softknn`, in three layers:

- the core: softknn/*.py (the library: encoder, engine, retrieval, bundles, generation, settings,
  console helpers), which imports no app;
- the apps, its subpackages softknn/service/, softknn/index_builder/ and softknn/evaluation/, which
  import the core and each other without a cycle;
- the `softknn` command, softknn/cli.py (and softknn/__main__.py): the composition root, which
  registers every app's commands and which nothing in the package imports.

Checked statically over every import statement of every file (function bodies included), and
dynamically in a fresh interpreter that imports every core module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "softknn"
TOP = {"cli.py", "__main__.py"}  # the `softknn` command
APPS = ("service", "index_builder", "evaluation")


def core_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py")
                  if p.relative_to(PKG).parts[0] not in APPS and p.relative_to(PKG).as_posix() not in TOP)


def core_modules() -> list[str]:
    return [".".join(("softknn",) + p.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")
            for p in core_files()]


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `import x` / `from x import y` in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def app_of(module: str) -> str | None:
    """The app a module belongs to ("service" for softknn.service.app), or None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "softknn" and parts[1] in APPS else None


def is_app(module: str) -> bool:
    return app_of(module) is not None


def test_the_core_and_the_apps_are_told_apart_by_their_place_in_the_package():
    assert "softknn.infer.engine" in core_modules() and "softknn.common.console" in core_modules()
    assert [m for m in core_modules() if m.startswith(("softknn.service", "softknn.cli"))] == []
    assert (app_of("softknn.service.routes.infer"), app_of("softknn.evaluation"), app_of("softknn.infer.engine"),
            app_of("service.app")) == ("service", "evaluation", None, None)


def test_the_static_check_sees_an_app_import_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import json\n\ndef g():\n    from softknn.evaluation.run import evaluate\n    import softknn.service.app\n")
    assert [(n, m) for n, m in imported_names(f) if is_app(m)] == [(4, "softknn.evaluation.run"), (5, "softknn.service.app")]


def test_no_core_file_imports_an_app():
    assert len(core_files()) >= 10
    bad = [f"{p.relative_to(ROOT)}:{n} imports {m}" for p in core_files() for n, m in imported_names(p) if is_app(m)]
    assert bad == []


def app_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """app -> the other apps its files import (statically, at any depth)."""
    graph: dict[str, set[str]] = {}
    for app in APPS:
        deps = graph.setdefault(app, set())
        for p in sorted((pkg / app).rglob("*.py")):
            deps |= {a for _, m in imported_names(p) if (a := app_of(m)) is not None and a != app}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        path.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (found := visit(u)):
            return found
    return None


def test_the_app_graph_check_sees_a_cycle_through_a_function_body(tmp_path):
    for app, body in (("service", "import json\n"),
                      ("index_builder", "def f():\n    from softknn.evaluation.metrics import auroc\n"),
                      ("evaluation", "from softknn.index_builder.reader import read_kb\n")):
        (tmp_path / app).mkdir()
        (tmp_path / app / "m.py").write_text(body)
    graph = app_graph(tmp_path)
    assert graph == {"service": set(), "index_builder": {"evaluation"}, "evaluation": {"index_builder"}}
    assert find_cycle(graph) == ["evaluation", "index_builder", "evaluation"]
    (tmp_path / "index_builder" / "m.py").write_text("import json\n")
    assert find_cycle(app_graph(tmp_path)) is None


def test_the_apps_import_each_other_without_a_cycle():
    graph = app_graph()
    assert "index_builder" in graph["evaluation"]  # the held-out calibration builds a second bundle
    assert "evaluation" not in graph["index_builder"]  # so the builder's calibration is the core's
    assert find_cycle(graph) is None, f"app import cycle: {' -> '.join(find_cycle(graph) or [])}"


def loaded_after_importing(modules: list[str]) -> list[str]:
    code = (f"import importlib, json, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_every_core_module_loads_no_app_and_no_web_framework():
    loaded = loaded_after_importing(core_modules())
    assert "softknn.infer.engine" in loaded and "softknn.storage.bundle" in loaded
    assert [m for m in loaded if is_app(m) or m.split(".")[0] in ("fastapi", "starlette", "uvicorn")] == []


def test_nothing_in_the_package_imports_the_softknn_command():
    files = sorted(p for p in PKG.rglob("*.py") if p.relative_to(PKG).as_posix() not in TOP)
    bad = [f"{p.relative_to(ROOT)}:{n} imports {m}" for p in files for n, m in imported_names(p)
           if m == "softknn.cli" or m.startswith("softknn.cli.")]
    assert bad == []


def test_the_wheel_installs_one_top_level_package():
    """pyproject's package list: only softknn and its subpackages (no generic `service` on sys.path)."""
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["softknn*"]
    assert [app for app in APPS if any((ROOT / app).rglob("*.py"))] == []  # no top-level source left behind


def test_the_softknn_command_loads_no_web_framework_until_serve_runs():
    loaded = loaded_after_importing(["softknn.cli"])
    assert "softknn.service.cli" in loaded and "softknn.evaluation.cli" in loaded  # the edge commands are registered
    assert [m for m in loaded if m.split(".")[0] in ("fastapi", "starlette", "uvicorn", "matplotlib")] == []


def test_no_test_imports_the_benchmarks():
    """Tests use the one server harness (tests/harness.py) and their own helpers, never bench/."""
    tests = sorted((ROOT / "tests").rglob("*.py"))
    assert len(tests) >= 20
    bad = [f"{p.relative_to(ROOT)}:{n} imports {m}" for p in tests for n, m in imported_names(p)
           if m.split(".")[0] == "bench"]
    assert bad == []
