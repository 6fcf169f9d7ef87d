"""The README stays true: its settings table is the one the Settings model produces."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_settings_table_matches_the_settings_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- settings-table:start")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- settings-table:end -->")
    assert readme[start:end].strip() == mod.table().strip()


def test_readme_first_commands_set_up_serve_and_test():
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```bash\n")[1:3]]
    assert "softknn serve --bundle bundles/sample" in blocks[0] and "sample-kb" in blocks[0]
    assert blocks[1].strip().endswith("python -m pytest")
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
