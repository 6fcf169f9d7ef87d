"""Bundles: deterministic, resumable after SIGKILL, verified, refused when corrupt or foreign."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from softknn.common.errors import BundleError
from softknn.retrieval.chunk_index import ChunkIndex, build_index, choose_index
from softknn.retrieval.lexical import LEXICAL_FILES
from softknn.storage.bundle import load_bundle
from softknn.storage.layout import DATA_FILES, verify_bundle, version_id

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", SOFTKNN_MODEL__THREADS="2")
    return subprocess.Popen([sys.executable, "-m", "softknn", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _checksums(path: Path) -> dict:
    return {k: v["sha256"] for k, v in json.loads((path / "manifest.json").read_text())["files"].items()}


@pytest.fixture(scope="module")
def small_kb(sample_kb):
    return sample_kb / "kb.jsonl"


@pytest.mark.timeout(1500)  # five CLI builds, each loading the model: past the suite's 600 s at load 14 here
def test_same_input_gives_the_same_checksums_and_a_kill_resumes_to_them(tmp_path, small_kb):
    ref = _cli("build", small_kb, "--out", tmp_path / "ref", "--batch-size", "8", "--no-progress")
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    again = _cli("build", small_kb, "--out", tmp_path / "again", "--batch-size", "8", "--no-progress")
    assert again.wait(timeout=300) == 0
    assert _checksums(tmp_path / "ref") == _checksums(tmp_path / "again")

    out = tmp_path / "killed"
    partial = tmp_path / ".killed.partial"
    for shards_before_kill in (2, 9):  # kill twice at different points, resuming in between
        proc = _cli("build", small_kb, "--out", out, "--batch-size", "8", "--no-progress")
        deadline = time.time() + 120
        while time.time() < deadline and len(list(partial.glob("shard-*"))) < shards_before_kill:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not out.exists()  # no half-written bundle is ever in place
        with pytest.raises(BundleError):
            verify_bundle(out)
    done = len(list(partial.glob("shard-*")))
    assert done >= 9
    proc = _cli("build", small_kb, "--out", out, "--batch-size", "8", "--no-progress")
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert _checksums(out) == _checksums(tmp_path / "ref")
    assert not partial.exists()


def test_verify_refuses_a_flipped_byte_and_an_edited_manifest(tmp_path, sample_bundle_path, encoder):
    bad = tmp_path / "bad"
    shutil.copytree(sample_bundle_path, bad)
    verify_bundle(bad)
    mem = bad / "mem_hidden.npy"  # the default memory's one file
    data = bytearray(mem.read_bytes())
    data[len(data) // 2] ^= 0x01
    mem.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"mem_hidden.npy: sha256 mismatch"):
        load_bundle(bad, expected_fingerprint=encoder.info.fingerprint)

    edited = tmp_path / "edited"
    shutil.copytree(sample_bundle_path, edited)
    m = json.loads((edited / "manifest.json").read_text())
    m["memory_layer"] = 2
    (edited / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="version_id does not match"):
        verify_bundle(edited)


def test_a_bundle_of_other_model_weights_is_refused(tmp_path, sample_bundle_path, encoder):
    foreign = tmp_path / "foreign"
    shutil.copytree(sample_bundle_path, foreign)
    m = json.loads((foreign / "manifest.json").read_text())
    m["model"]["fingerprint"] = "0" * 64
    m["version_id"] = version_id(m)
    (foreign / "manifest.json").write_text(json.dumps(m))
    verify_bundle(foreign)  # intact files: only the model check can refuse it
    with pytest.raises(BundleError, match="built with model weights 000000000000"):
        load_bundle(foreign, expected_fingerprint=encoder.info.fingerprint)


def test_cli_verify_and_info(sample_bundle_path, tmp_path):
    ok = _cli("verify", sample_bundle_path)
    assert ok.wait(timeout=60) == 0 and "ok:" in ok.stdout.read()
    missing = _cli("verify", tmp_path / "nope")
    assert missing.wait(timeout=60) == 2 and "no such bundle folder" in missing.stderr.read()
    info = _cli("info", sample_bundle_path)
    assert info.wait(timeout=60) == 0
    m = json.loads(info.stdout.read())
    assert m["counts"]["chunks"] == 297 and m["index"]["kind"] == "flat" and len(m["labels"]) == 12
    assert sorted(m["files"]) == sorted(DATA_FILES + LEXICAL_FILES)  # every file under its checksum


def test_build_refuses_to_overwrite_without_force(sample_bundle_path, small_kb):
    proc = _cli("build", small_kb, "--out", sample_bundle_path, "--no-progress")
    assert proc.wait(timeout=120) == 2
    assert "already exists; pass --force" in proc.stderr.read()


@pytest.mark.parametrize("kind", ["hnsw", "ivf", "ivfpq"])
def test_ann_indexes_find_the_exact_neighbours_on_the_sample(sample_bundle, kind):
    xb = np.asarray(sample_bundle.index.xb)
    spec = choose_index(len(xb), xb.shape[1], kind)
    ann = ChunkIndex(build_index(xb, spec), xb, spec)
    xq = xb[:50] + 0.01  # near-duplicates of KB chunks
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    _, I_exact = sample_bundle.index.search(xq, 5, exact=True)
    D, I = ann.search(xq, 5)
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(I, I_exact)])
    assert recall >= 0.9
    assert (np.diff(D, axis=1) <= 1e-6).all()  # sorted best first


def test_cli_query_json_exact(sample_bundle_path):
    proc = _cli("query", sample_bundle_path, "Can I bring my dog?", "lost wallet", "--json", "--exact", "--k", "4",
                "--alpha", "0.5", "--mixing", "fixed")
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    out = json.loads(proc.stdout.read())
    assert out["model"] == "all-MiniLM-L6-v2" and len(out["bundle_version"]) == 16
    assert len(out["results"]) == 2
    r = out["results"][0]
    assert set(r) >= {"embedding", "evidence", "diagnostics", "label_scores", "prediction"}
    assert len(r["embedding"]) == 384 and r["diagnostics"]["retrieved"] == 4
    assert r["diagnostics"]["memory_share"] == pytest.approx(0.5, abs=1e-6)
    assert r["diagnostics"]["search"] == "exact"


def test_cli_builds_hidden_by_default_and_kv_when_asked_with_the_same_exact_answers(tmp_path):
    """`softknn build` stores the layer's input states (`hidden`) unless told `--memory kv`; both
    bundles verify, name their memory, hold only its files, and `softknn query --json --exact`
    answers the same from either, to float32 round-off."""
    from typer.testing import CliRunner

    from softknn.cli import app
    from tests.numerics import assert_tree_close

    kb = tmp_path / "kb.jsonl"
    kb.write_text("".join(json.dumps({"id": f"d{i}", "text": t, "label": lab}) + "\n" for i, (t, lab) in enumerate([
        ("Dogs must stay on a lead on the car deck.", "pets"), ("Cats travel in a closed carrier.", "pets"),
        ("A refund is paid within five working days.", "refunds"), ("Cancel two hours before departure.", "refunds"),
        ("Sailings are cancelled above force eight.", "weather")])))
    runner = CliRunner()
    answers = {}
    for kind, extra in (("hidden", []), ("kv", ["--memory", "kv"])):
        out = tmp_path / kind
        r = runner.invoke(app, ["build", str(kb), "--out", str(out), "--no-progress", *extra])
        assert r.exit_code == 0, r.output
        assert f"memory {kind}" in r.output
        m = verify_bundle(out)
        assert m["memory"] == kind
        mem = sorted(f for f in m["files"] if f.startswith(("kv_", "mem_")))
        assert mem == {"hidden": ["mem_hidden.npy"], "kv": ["kv_keys.npy", "kv_values.npy"]}[kind]
        r = runner.invoke(app, ["query", str(out), "can my dog come?", "money back", "--json", "--exact", "--k", "3"])
        assert r.exit_code == 0, r.output
        answers[kind] = json.loads(r.stdout)
    assert answers["hidden"]["bundle_version"] != answers["kv"]["bundle_version"]
    assert_tree_close(answers["hidden"]["results"], answers["kv"]["results"], 1e-5)
