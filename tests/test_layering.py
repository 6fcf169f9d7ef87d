"""One installed package, `softknn`, in three layers:

- the core: softknn/params.py (the Settings, over common/ alone) and the subpackages common/ (errors,
  the parameter table, the commands' shared helpers, file locks, KB names, locations, filters), model/ (the seams, the encoder and its runtimes, the fused attention),
  retrieval/, storage/, infer/ and generate/, which import no app and no loop among themselves:
  neither between two modules (an import inside a function body counts: that is where loops hide)
  nor between two subpackages, but for the edges listed in ALLOWED, each with why;
- the apps, the subpackages service/, index_builder/ and evaluation/, which import the core and each
  other without a cycle;
- the `softknn` command, softknn/cli.py (and softknn/__main__.py): the composition root, which
  registers every app's commands and which nothing in the package imports.

The package root holds only those entry points and params.py. Checked statically over every import
statement of every file (function bodies and `if TYPE_CHECKING:` blocks included), and dynamically
in a fresh interpreter that imports every core module."""

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
CORE = ("common", "model", "retrieval", "storage", "infer", "generate")  # the core's subpackages; params.py beside them
ROOT_FILES = ["__init__.py", "__main__.py", "cli.py", "params.py"]

# Core imports that go against the subpackage order (common < params < model < retrieval < storage
# < infer < generate), each with why it stays. Only the subpackage graph skips them: the module graph
# has no loop at all. params.py imports common/ alone (test_params_imports_only_common).
ALLOWED = {
    ("softknn.retrieval.search", "softknn.storage.layout"):
        "type-only (TYPE_CHECKING): a Retriever is typed by the Bundle it searches, which storage builds "
        "from retrieval's indexes",
    ("softknn.retrieval.search", "softknn.storage.shards"):
        "type-only (TYPE_CHECKING): the same, for a sharded bundle's ShardedBundle",
}


def core_files(pkg: Path = PKG) -> list[Path]:
    return sorted(p for p in pkg.rglob("*.py")
                  if p.relative_to(pkg).parts[0] not in APPS and p.relative_to(pkg).as_posix() not in TOP)


def module_of(path: Path, pkg: Path = PKG) -> str:
    """softknn/storage/bundle.py -> softknn.storage.bundle; a package's __init__.py is the package."""
    return ".".join((pkg.name,) + path.relative_to(pkg).with_suffix("").parts).removesuffix(".__init__")


def core_modules(pkg: Path = PKG) -> list[str]:
    return [module_of(p, pkg) for p in core_files(pkg)]


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every `import x` / `from x import a, b` in the file, at any depth."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in the file, at any depth."""
    return [(n, m) for n, m, _ in imports(path)]


def app_of(module: str) -> str | None:
    """The app a module belongs to ("service" for softknn.service.app), or None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "softknn" and parts[1] in APPS else None


def is_app(module: str) -> bool:
    return app_of(module) is not None


def layer_of(module: str) -> str:
    """The core subpackage of a core module ("storage" for softknn.storage.bundle), or "params"."""
    return module.split(".")[1]


def core_module_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """core module -> the core modules it imports (any depth): `from a.b import c` names the module
    a.b.c where there is one, else a.b; `import a.b.c` the longest of a, a.b, a.b.c that is one."""
    files = {module_of(p, pkg): p for p in core_files(pkg)}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps = graph.setdefault(mod, set())
        for _, target, names in imports(path):
            found = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            if not found:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                found = [target] if target else []
            deps |= {t for t in found if t != mod}
    return graph


def subpackage_graph(modules: dict[str, set[str]], allowed=ALLOWED) -> dict[str, set[str]]:
    """core subpackage -> the other core subpackages its modules import, but for the `allowed` edges."""
    graph: dict[str, set[str]] = {}
    for mod, deps in modules.items():
        if mod == PKG.name:  # softknn/__init__.py
            continue
        out = graph.setdefault(layer_of(mod), set())
        out |= {layer_of(d) for d in deps if (mod, d) not in allowed and d != PKG.name} - {layer_of(mod)}
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


def test_the_core_and_the_apps_are_told_apart_by_their_place_in_the_package():
    assert "softknn.infer.engine" in core_modules() and "softknn.common.console" in core_modules()
    assert "softknn.params" in core_modules()
    assert [m for m in core_modules() if m.startswith(("softknn.service", "softknn.cli"))] == []
    assert (app_of("softknn.service.routes.infer"), app_of("softknn.evaluation"), app_of("softknn.infer.engine"),
            app_of("service.app")) == ("service", "evaluation", None, None)


def test_the_package_root_holds_only_the_entry_points_and_the_parameters():
    assert sorted(p.name for p in PKG.glob("*.py")) == ROOT_FILES
    packages = sorted(p.parent.name for p in PKG.glob("*/__init__.py"))
    assert packages == sorted(CORE + APPS)


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


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "softknn"
    for name, body in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        for d in (pkg / name).relative_to(pkg).parents:
            (pkg / d / "__init__.py").touch()
        (pkg / name).write_text(body)
    return pkg


def test_the_core_graph_check_sees_a_loop_through_a_function_body(tmp_path):
    pkg = _fake_package(tmp_path, {
        "storage/a.py": "import json\n\n\ndef f():\n    from softknn.storage import b\n\n    return b\n",
        "storage/b.py": "from softknn.storage.a import f\n",
        "common/c.py": "from softknn.storage.b import f\n",
        "common/d.py": "",
        "service/app.py": "from softknn.common.c import f\n",  # an app: not in the core's graph
    })
    graph = core_module_graph(pkg)
    assert graph == {"softknn": set(), "softknn.common": set(), "softknn.storage": set(), "softknn.common.d": set(),
                     "softknn.storage.a": {"softknn.storage.b"}, "softknn.storage.b": {"softknn.storage.a"},
                     "softknn.common.c": {"softknn.storage.b"}}
    assert find_cycle(graph) == ["softknn.storage.b", "softknn.storage.a", "softknn.storage.b"]  # reached from common.c
    (pkg / "storage" / "b.py").write_text("import json\n")  # the loop removed: both checks pass
    assert find_cycle(core_module_graph(pkg)) is None and find_cycle(subpackage_graph(core_module_graph(pkg))) is None
    (pkg / "storage" / "b.py").write_text("def g():\n    from softknn.common import d\n")  # c -> b -> d: no module loop
    graph = core_module_graph(pkg)
    assert find_cycle(graph) is None
    assert find_cycle(subpackage_graph(graph)) == ["common", "storage", "common"]  # but common <-> storage
    allowed = {("softknn.storage.b", "softknn.common.d"): "listed, with why"}
    assert find_cycle(subpackage_graph(graph, allowed)) is None


def test_no_import_loop_among_the_core_modules():
    graph = core_module_graph()
    assert len(graph) >= 40
    assert "softknn.storage.shards" in graph["softknn.storage.bundle"]  # a sharded bundle loads through shards
    assert "softknn.storage.bundle" not in graph["softknn.storage.shards"]  # a shard opens through layout
    assert find_cycle(graph) is None, f"core import loop: {' -> '.join(find_cycle(graph) or [])}"


def test_params_imports_only_common():
    """The settings and the parameter table sit under the rest of the core: params.py imports nothing of
    softknn but common/, so `softknn --help` reads them before numpy, and no core module needs an
    edge to it against the order."""
    own = [m for _, m in imported_names(PKG / "params.py") if m.split(".")[0] == PKG.name]
    assert own and [m for m in own if not m.startswith("softknn.common.")] == []
    assert len(ALLOWED) <= 2


def test_no_import_loop_among_the_core_subpackages_but_the_allowed_edges():
    modules = core_module_graph()
    assert [edge for edge in ALLOWED if edge[1] not in modules.get(edge[0], ())] == []  # none stale
    graph = subpackage_graph(modules)
    assert sorted(graph) == sorted((*CORE, "params"))
    assert graph["common"] == set() and graph["params"] == {"common"} and graph["model"] == {"common", "params"}
    assert find_cycle(graph) is None, f"core subpackage loop: {' -> '.join(find_cycle(graph) or [])}"


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
    assert not (PKG / "service" / "testing.py").exists()  # the server harness ships with the tests (tests/harness.py)


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
