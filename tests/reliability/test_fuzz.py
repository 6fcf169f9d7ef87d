"""Property-based fuzzing of the live API with schemathesis: ≥ 1,000 generated requests,
zero 5xx, zero schema-breaking responses, the server still ready afterwards.

The server is a real `python -m softknn.service.cli` process with an API key and an admin token (so the
auth checks mean something) and tighter limits (8 inputs, 1,000 characters, k ≤ 64, 10 evidence
items), which it checks against its settings (the static OpenAPI document says them in the fields'
descriptions): a generated positive request past them is refused at once (413, 422), so the run
stays cheap enough on the 2-core box. schemathesis reads that document from the live server and runs every phase:
examples, coverage (boundary and invalid values of every field), fuzzing (positive and negative
data) and stateful (sequences along the links injected by st_hooks.py: infer → entry, index →
reload of the served bundle, reload → index/entry), with every check, including
not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance,
negative_data_rejection, positive_data_acceptance, ignored_auth and missing_required_header.
Settings: tests/reliability/schemathesis.toml. The same run by hand: docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import ADMIN_TOKEN, LiveServer

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SEED = 20261130
MAX_EXAMPLES = 120  # per operation and phase; ≈ 1,400 requests, ≈ 40 s here
LIMITS = {"SOFTKNN_LIMITS__MAX_INPUTS": "8", "SOFTKNN_LIMITS__MAX_CHARS": "1000", "SOFTKNN_LIMITS__MAX_K": "64",
          "SOFTKNN_LIMITS__MAX_EVIDENCE": "10"}


def st_command(url: str, report: Path) -> list[str]:
    st = Path(sys.executable).with_name("st")
    return [str(st), "--no-color", "--config-file", str(HERE / "schemathesis.toml"), "run", f"{url}/openapi.json",
            "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
            "--report", "json", "--report-json-path", str(report)]


@pytest.mark.timeout(1800)  # ≈ 4,000 requests: 4 min at load 2 here, 8.6 min at load 12 (the suite's limit is 600 s)
def test_schemathesis_finds_no_server_error_and_no_schema_break(sample_bundle_path, tmp_path, write_figure):
    report, requests_log = tmp_path / "report.json", tmp_path / "requests.log"
    bundle = tmp_path / "bundle"  # a copy: the admin token lets the fuzzer PUT and DELETE documents (KB writes)
    shutil.copytree(sample_bundle_path, bundle)
    with LiveServer.start(bundle, tmp_path / "server.log", env=LIMITS) as srv:
        env = {**os.environ, "SOFTKNN_FUZZ_ADMIN_TOKEN": ADMIN_TOKEN, "SOFTKNN_FUZZ_LOG": str(requests_log),
               "SCHEMATHESIS_HOOKS": "tests.reliability.st_hooks",
               "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
        server_5xx_before = srv.server_errors()  # the /readyz 503s while it was loading
        t0 = time.monotonic()
        run = subprocess.run(st_command(srv.url, report), cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=1500)
        seconds = time.monotonic() - t0
        out = run.stdout + run.stderr
        ready_after = srv.client.get("/readyz").status_code
        infer_after = srv.client.post("/v1/infer", json={"inputs": ["still answering?"]}).status_code
        server_5xx = srv.server_errors() - server_5xx_before
        alive = srv.proc.poll() is None
        log = srv.log()

    assert run.returncode == 0, out[-6000:]
    rep = json.loads(report.read_text())
    sent = [line.rsplit(" ", 1) for line in requests_log.read_text().splitlines()]
    statuses = Counter(int(status) for _, status in sent)
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected / (\d+) total", out)
    figure = {
        "schemathesis": rep["schemathesis_version"], "seed": SEED, "max_examples": MAX_EXAMPLES,
        "seconds": round(seconds, 1), "requests_generated": rep["test_cases"]["generated"],
        "requests_sent": len(sent), "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_5xx": int(server_5xx), "client_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "failures": rep["failures"], "errors": rep["errors"],
        "phases": {name: p["status"] for name, p in rep["phases"].items()},
        "stateful_links_covered": links.group(0) if links else None,
        "bundle_swaps_via_links": log.count("bundle swapped"),
        "ready_after": ready_after, "server_errors_logged": log.count('"level": "error"'),
    }
    write_figure("fuzz", figure)
    assert rep["test_cases"]["generated"] >= 1000 and len(sent) >= 1000
    assert rep["failures"] == [] and rep["errors"] == []
    assert figure["client_5xx"] == 0 and figure["server_5xx"] == 0
    assert {"coverage", "fuzzing", "stateful"} <= {k for k, v in figure["phases"].items() if v == "success"}
    assert links and links.group(1) == links.group(3), out[-3000:]  # every link was followed
    assert figure["bundle_swaps_via_links"] >= 1  # the stateful phase really reloaded
    assert (ready_after, infer_after, alive) == (200, 200, True)
    assert figure["server_errors_logged"] == 0, [ln for ln in log.splitlines() if '"level": "error"' in ln][:3]
