"""The README stays true: its commands and samples are what the code does. The settings table lives
in docs/usage.md (the one the Settings model produces); the client sample in docs/client.md."""

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_usage_settings_table_matches_the_settings_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (ROOT / "docs" / "usage.md").read_text()
    start = readme.index("<!-- settings-table:start")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- settings-table:end -->")
    assert readme[start:end].strip() == mod.table().strip()
    assert "docs/usage.md#settings" in (ROOT / "README.md").read_text()  # the README points to it


def test_readme_first_commands_set_up_serve_and_test():
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```bash\n")[1:3]]
    assert "softknn serve --bundle bundles/sample" in blocks[0] and "sample-kb" in blocks[0]
    assert blocks[1].strip().endswith("python -m pytest")
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()


# --- the samples print what the commands print -----------------------------------------------
NUM = re.compile(r"-?\d+\.\d+")


def _fence(readme: str, opener: str) -> str:
    start = readme.index(opener) + len(opener)
    return readme[start : readme.index("```", start)]


def test_readme_query_sample_is_what_the_command_prints(sample_bundle_path, encoder, monkeypatch):
    from typer.testing import CliRunner

    from softknn.cli import app

    block = _fence((ROOT / "README.md").read_text(), "```text\n")
    cmd, *want = block.strip("\n").splitlines()
    args = shlex.split(cmd.removeprefix("$ softknn "))
    assert args[:2] == ["query", "bundles/sample"]
    args[1] = str(sample_bundle_path)  # the quick start's bundle, built by the fixture the same way
    monkeypatch.setattr("softknn.cli._encoder", lambda settings: encoder)
    r = CliRunner().invoke(app, args, prog_name="softknn")
    assert r.exit_code == 0, r.output
    got = r.output.strip("\n").splitlines()
    assert len(got) == len(want)  # every evidence line, and no more
    for g, w in zip(got, want, strict=True):
        assert NUM.sub("#", g) == NUM.sub("#", w)  # chunk ids, labels, words, "abstained", … exactly
        for x, y in zip(NUM.findall(g), NUM.findall(w), strict=True):  # a printed number may round the
            assert abs(float(x) - float(y)) <= 1.01 * _last_digit(y), (g, w)  # other way on another CPU



def _last_digit(number: str) -> float:
    """One unit in the last printed place of `number` ("2.61" -> 0.01, "7" -> 1)."""
    return 10.0 ** -len(number.partition(".")[2])


def test_readme_curl_sample_is_what_the_service_answers(engine):
    from softknn.infer.engine import InferParams
    from softknn.storage.layout import version_id

    readme = (ROOT / "README.md").read_text()
    request = json.loads(re.search(r"-d '(\{.*?\})'", readme).group(1))
    shown = json.loads(_fence(readme, "[.spans[:2][] | .text]}]}'\n"))
    r = engine.infer(request["inputs"], InferParams(evidence=request["evidence"]))[0].to_dict()
    assert re.fullmatch(r"[0-9a-f]{16}", shown["bundle_version"])  # a content hash: it varies, and the README says so
    assert "`bundle_version` is the bundle's content address" in readme and "without its build time" in readme
    raw = engine.bundle.manifest.raw  # what the README says of it: the build time is not part of it
    assert version_id({**raw, "created_at": "1999-12-31T23:59:59+00:00"}) == raw["version_id"] == engine.bundle.version
    assert version_id({**raw, "counts": {**raw["counts"], "chunks": raw["counts"]["chunks"] + 1}}) != raw["version_id"]
    assert shown["prediction"] == r["prediction"]
    assert shown["label_scores"] == pytest.approx(r["label_scores"], abs=1e-4)
    assert list(shown["label_scores"]) == list(r["label_scores"])
    assert shown["memory_share"] == pytest.approx(r["diagnostics"]["memory_share"], abs=1e-6)
    assert len(shown["evidence"]) == len(r["evidence"]) == 2
    for s, e in zip(shown["evidence"], r["evidence"], strict=True):
        assert (s["chunk_id"], s["label"], s["spans"]) == (e["chunk_id"], e["label"], [x["text"] for x in e["spans"][:2]])
        for k in ("similarity", "weight", "mass_share"):
            assert s[k] == pytest.approx(e[k], abs=1e-4), (s["chunk_id"], k)


def test_client_doc_sample_is_what_the_client_prints(engine):
    """docs/client.md's snippet prints what the service answers with its defaults (the client prints
    `prediction` and each evidence item's `doc_id` and `weight`, rounded to 3 places)."""
    from softknn.infer.engine import InferParams
    from softknn.params import Settings

    session = (ROOT / "docs" / "client.md").read_text()
    call = re.search(r'InferRequest\(inputs=\["(.*?)"\], evidence=(\d+)\)', session)
    assert call is not None and 'print(res.results[0].prediction, [(e.doc_id, round(e.weight, 3))' in session
    shown = re.search(r"snippet\.py +# the five lines above\n(\w+) (\[.*?\])\n```", session)
    assert shown is not None
    label, items = shown.group(1), re.findall(r"\('([^']+)', (\d+\.\d+)\)", shown.group(2))
    r = engine.infer([call.group(1)], [InferParams.from_defaults(Settings().defaults, evidence=int(call.group(2)))])[0]
    assert label == r.prediction
    assert [doc for doc, _ in items] == [e.doc_id for e in r.evidence]
    for (_, w), e in zip(items, r.evidence, strict=True):
        assert abs(float(w) - e.weight) <= 1.01 * _last_digit(w), (w, e.weight)
