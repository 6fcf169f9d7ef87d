"""model.runtime in the service: /v1/index and /metrics name it; the default (auto) serves onnx,
with `exact: true` answers equal to torch's; an export that fails its checks keeps an explicit onnx
service from starting, and makes the default serve torch, saying why."""

from __future__ import annotations

import shutil
import time

from fastapi.testclient import TestClient

from softknn.service.app import create_app
from tests.numerics import assert_tree_close
from tests.service.conftest import wait_ready

BODY = {"inputs": ["Can I take my bicycle on the morning boat?", "refund"], "exact": True, "k": 8, "evidence": 3}


def test_index_and_metrics_name_the_torch_runtime(inproc):
    r = inproc.get("/v1/index")
    assert r.status_code == 200
    assert r.json()["runtime"] == {"name": "torch", "precision": "fp32", "verified_max_abs_diff": None,
                                   "requested": "torch", "fallback": None}
    metrics = inproc.get("/metrics").text
    assert 'runtime="torch"' in metrics and 'precision="fp32"' in metrics
    assert next(line for line in metrics.splitlines() if line.startswith("softknn_model_info{")).endswith(" 1.0")


def _close(a, b):
    """Numbers within 1e-4 (relative above unit scale: tests/numerics.py), the rest equal; request ids differ."""
    assert_tree_close(a, b, 1e-4, skip=lambda path: path.endswith("request_id"))


def test_the_default_runtime_serves_onnx_with_exact_answers_equal_to_torch(inproc, make_settings, tmp_path):
    settings = make_settings(model={"threads": 1, "onnx_cache": tmp_path})  # model.runtime left at its default
    assert settings.model.runtime == "auto"
    with TestClient(create_app(settings)) as client:  # the app loads its own model with the setting
        wait_ready(client, 300)
        idx = client.get("/v1/index").json()
        assert idx["runtime"]["name"] == "onnx" and idx["runtime"]["precision"] == "fp32"
        assert (idx["runtime"]["requested"], idx["runtime"]["fallback"]) == ("auto", None)
        assert 0 < idx["runtime"]["verified_max_abs_diff"] <= 1e-4
        assert 'runtime="onnx"' in client.get("/metrics").text
        got = client.post("/v1/infer", json=BODY)
    want = inproc.post("/v1/infer", json=BODY)
    assert got.status_code == want.status_code == 200
    _close(got.json(), want.json())

    # the same cache with the export tampered with: the service does not start, and says why
    export = next(tmp_path.glob("*-fp32.onnx"))
    data = bytearray(export.read_bytes())
    data[len(data) // 2] ^= 0xFF
    export.write_bytes(bytes(data))
    explicit = make_settings(model={"threads": 1, "runtime": "onnx", "onnx_cache": tmp_path})
    with TestClient(create_app(explicit)) as client:
        end = time.monotonic() + 300
        while (r := client.get("/healthz")).status_code == 200 and time.monotonic() < end:
            time.sleep(0.2)  # startup (model load, then the export's checks) runs in the background
        assert r.status_code == 503
        assert "modified after it was written" in r.json()["error"]["message"]
    with TestClient(create_app(settings)) as client:  # the default starts on torch and reports why
        wait_ready(client, 300)
        rt = client.get("/v1/index").json()["runtime"]
        assert (rt["name"], rt["requested"], rt["verified_max_abs_diff"]) == ("torch", "auto", None)
        assert "modified after it was written" in rt["fallback"]
        assert 'runtime="torch"' in client.get("/metrics").text
        fallback = client.post("/v1/infer", json=BODY)
    assert fallback.status_code == 200
    _close(fallback.json(), want.json())
    shutil.rmtree(tmp_path, ignore_errors=True)
