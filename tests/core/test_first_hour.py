"""A newcomer's first hour with the CLI: answers before the model loads, field names
named or inferred, the stored ones reused, and no abstain threshold from too few validation rows."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softknn.cli import app
from softknn.common.errors import KBFormatError
from softknn.index_builder.reader import Fields, resolve_fields

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "sentence_transformers", "faiss", "fastapi", "numpy")

TOPICS = {
    "tickets": ["How much is a ticket to {}?", "Can I buy a return ticket to {} on board?",
                "Is there a child fare for the {} crossing?"],
    "luggage": ["Can I bring a bicycle to {}?", "How many bags may I take to {}?",
                "Is there a fee for a surfboard on the {} ferry?"],
    "schedule": ["When is the first ferry to {}?", "Does the {} ferry run on Sundays?",
                 "How long is the crossing to {}?"],
}
PLACES = ["Harrowmere", "Brindlewick", "Saltbridge", "Kestrel Holm"]


def _faq(path: Path, rows_per_topic: int = 10) -> Path:
    """A 30-row FAQ with the columns a newcomer has: question, topic (no id, no 'text')."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question", "topic"])
        for topic, forms in TOPICS.items():
            for i in range(rows_per_topic):
                w.writerow([forms[i % len(forms)].format(PLACES[i % len(PLACES)]) + f" (#{i})", topic])
    return path


# --- answered before anything heavy loads -----------------------------------------------------
PROBE = """
import json, sys, time
t0 = time.perf_counter()
from softknn.cli import app
out = {}
for args in json.loads(sys.argv[1]):
    t = time.process_time()
    try:
        app(args, prog_name="softknn")
    except SystemExit as e:
        out[args[0]] = {"code": e.code, "cpu_seconds": time.process_time() - t}
out["heavy"] = sorted(m for m in %r if m in sys.modules)
out["total"] = time.perf_counter() - t0
print(json.dumps(out))
""" % (HEAVY,)  # noqa: UP031 (the probe holds literal braces; %r keeps them as written)


def test_a_bad_bundle_path_is_answered_without_loading_the_model(tmp_path):
    missing = str(tmp_path / "no-such-bundle")
    (tmp_path / "not-a-bundle").mkdir()
    faq = _faq(tmp_path / "faq.csv")
    calls = [["query", missing, "hello"], ["verify", missing], ["info", missing], ["add-lexical", missing],
             ["eval", missing, str(faq)], ["calibrate", missing, str(faq)], ["serve", "--bundle", missing],
             ["build", str(faq), "--out", str(tmp_path / "b")]]
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls)], capture_output=True, text=True,
                       cwd=REPO, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # torch, the model code, FAISS, FastAPI, even numpy: none imported to say the path is wrong
    assert out["heavy"] == []
    for args in calls:
        assert out[args[0]]["code"] == 2, args
        # CPU time, not the wall clock: a loaded box stalls a light process too (model loading
        # alone takes 7–9 CPU s; these answers take milliseconds)
        assert out[args[0]]["cpu_seconds"] < 1.0, (args, out[args[0]])
    assert r.stderr.count(f"{missing}: no such bundle folder") == 7
    assert "no column 'text'" in r.stderr  # build: the field check comes before the model too


def test_an_invalid_kb_line_is_answered_before_the_model_loads_with_its_line_and_column(tmp_path):
    kb = tmp_path / "kb.jsonl"
    kb.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": "also ok"}\n{"id": "c", "text": "cut off}\n',
                  encoding="utf-8")
    calls = [["build", str(kb), "--out", str(tmp_path / "b")]]
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls)], capture_output=True, text=True,
                       cwd=REPO, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["build"]["code"] == 2
    assert out["build"]["cpu_seconds"] < 1.0  # CPU time: model loading alone takes 7–9 s
    # the whole message: where the unterminated string starts, as a line and a column
    assert f"error: {kb}:3:21: invalid JSON: Unterminated string starting at (line 3, column 21)\n" in r.stderr


def test_not_a_bundle_folder_is_named(tmp_path):
    r = CliRunner().invoke(app, ["query", str(tmp_path), "hello"])
    assert r.exit_code == 2
    assert f"{tmp_path}: not a bundle (no manifest.json)" in r.output


def test_usage_lines_print_argument_names_without_braces():
    r = CliRunner().invoke(app, ["query", "--help"], prog_name="softknn", env={"COLUMNS": "120"})
    assert r.exit_code == 0
    assert "softknn query [OPTIONS] BUNDLE TEXTS..." in r.output
    r = CliRunner().invoke(app, ["calibrate"], prog_name="softknn")
    assert "Usage: softknn calibrate [OPTIONS] BUNDLE KB" in r.output and "{" not in r.output


# --- field names ------------------------------------------------------------------------------
def test_missing_text_column_names_the_columns_and_the_flags(tmp_path):
    faq = _faq(tmp_path / "faq.csv")
    r = CliRunner().invoke(app, ["build", str(faq), "--out", str(tmp_path / "b")])
    assert r.exit_code == 2
    msg = " ".join(r.output.split())
    assert f"{faq}:1: no column 'text' (columns: question, topic)." in msg
    assert "e.g. --text-field question --label-field topic" in msg  # the longer column as the text
    assert "--id-field" in msg
    assert not (tmp_path / "b").exists()


def test_one_text_column_left_is_used_and_said_and_filled_ids_are_said(tmp_path):
    faq = _faq(tmp_path / "faq.csv")
    fields, notes = resolve_fields(faq, Fields(label="topic"))
    assert fields == Fields(id="id", text="question", label="topic")
    assert notes == ["faq.csv: no column 'text'; using 'question' as the text (--text-field question)",
                     "faq.csv: no 'id' column: ids are filled in from the file name and the row (faq-1, faq-2, …); "
                     "--id-field names a column to use instead"]
    # a text field the user named is never swapped for another
    with pytest.raises(KBFormatError, match="no column 'body'"):
        resolve_fields(faq, Fields(text="body", label="topic"), text_given=True)


def test_build_then_calibrate_reuses_the_field_names_and_refuses_a_threshold_from_3_rows(tmp_path, encoder, monkeypatch):
    monkeypatch.setattr("softknn.cli._encoder", lambda settings: encoder)  # the session's model, loaded once
    faq, bundle = _faq(tmp_path / "faq.csv"), tmp_path / "faq-bundle"
    runner = CliRunner()
    r = runner.invoke(app, ["build", str(faq), "--out", str(bundle), "--label-field", "topic", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "note: faq.csv: no column 'text'; using 'question' as the text (--text-field question)" in r.output
    assert "ids are filled in from the file name and the row (faq-1, faq-2, …)" in r.output
    assert "abstain thresholds: leave-one-out over 30 labelled chunks" in r.output
    assert "warning: only 30 labelled chunks (< 134): each threshold sits at the lowest score" in r.output
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["build"]["fields"] == {"id": "id", "text": "question", "label": "topic"}
    assert m["labels"] == ["luggage", "schedule", "tickets"]

    # no field flags: the bundle's are used (the KB has no 'text' or 'label' column to fall back on)
    r = runner.invoke(app, ["calibrate", str(bundle), str(faq), "--work", str(tmp_path / "cal"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "warning: only 3 validation queries (< 100, see --min-validation): too few to set an abstain threshold" in r.output
    assert f"calibrated {bundle} on 3 validation queries (fields: text 'question', label 'topic')" in r.output
    cal = json.loads((bundle / "manifest.json").read_text())["calibration"]
    assert (cal["abstain_threshold"], cal["min_similarity"], cal["abstain_threshold_gated"]) == (None, None, None)
    assert cal["validation"]["n"] == 3 and cal["validation"]["min_n"] == 100
    assert set(cal["validation"]["unapplied"]) == {"abstain_threshold", "min_similarity", "abstain_threshold_gated"}

    # the fallback answers in-scope questions instead of abstaining on them
    r = runner.invoke(app, ["query", str(bundle), "--json", "Is there a child fare for the Saltbridge crossing?"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)["results"][0]
    assert (res["abstained"], res["prediction"]) == (False, "tickets")


def test_enough_validation_rows_keep_the_threshold():
    from softknn.evaluation.holdout import min_validation, small_validation

    assert [min_validation(t) for t in (0.01, 0.05, 0.03, 0.0, 0.001)] == [100, 20, 34, 100, 100]
    rec = {"abstain_threshold": 0.4, "min_similarity": 0.3, "abstain_threshold_gated": 0.2, "validation": {"n": 20}}
    assert small_validation(json.loads(json.dumps(rec)), 20) == {**rec, "validation": {"n": 20, "min_n": 20}}
    small = small_validation(json.loads(json.dumps(rec)), 21)
    assert (small["abstain_threshold"], small["min_similarity"], small["abstain_threshold_gated"]) == (None, None, None)
    assert small["validation"]["unapplied"] == {"abstain_threshold": 0.4, "min_similarity": 0.3, "abstain_threshold_gated": 0.2}
    assert small["validation"]["too_small"].startswith("only 20 validation queries (< 21, see --min-validation)")


LOADER = """
import sys
from softknn.cli import app
try:
    app(sys.argv[1:] + ["sample-kb"], prog_name="softknn")  # the callback runs first, as before any command
except SystemExit:
    pass
from softknn.model.encoder import Encoder
Encoder()
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_the_model_loader_bar_shows_only_with_verbose(verbose):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    r = subprocess.run([sys.executable, "-c", LOADER, *(["--verbose"] if verbose else [])], capture_output=True,
                       text=True, cwd=REPO, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert ("Loading weights" in r.stderr) == verbose, r.stderr[-2000:]


def test_the_cli_names_its_flag_for_an_input_over_the_token_limit(monkeypatch, encoder, sample_bundle_path):
    monkeypatch.setattr("softknn.cli._encoder", lambda settings: encoder)  # the session's model, not a second load
    long = " ".join(["ferry"] * 300)
    r = CliRunner().invoke(app, ["query", str(sample_bundle_path), "short", long])
    assert r.exit_code == 2
    assert "error: input 1 has 302 tokens, more than the limit 256; pass --truncate to cut it\n" in r.output
    assert "truncate=true" not in r.output  # that is the HTTP field the service names
    r = CliRunner().invoke(app, ["query", str(sample_bundle_path), "--truncate", "--json", long])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["results"][0]["diagnostics"]["truncated"] is True
