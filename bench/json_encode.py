"""Rendering a /v1/infer answer: stdlib json vs orjson, and orjson over typed results vs over dicts.

The standard library's json is what Starlette's JSONResponse does; the typed results
(softknn.infer.results dataclasses) are what the route renders now, the dicts what it rendered before them.

    python -m bench json_encode [--calls 2000] [--threads 1]

The answers are real: Engine.infer on 20 real queries (bench/kb.py) over the 10k real bundle,
k 8, evidence 5, wrapped as the route wraps them. The three arms render the same answers,
interleaved; the decoded results are checked equal. Writes bench/results/json_encode.json|png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.common import RESULTS, write
from bench.kb import set_threads


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    import orjson

    from bench.kb import bundle_path, device, queries
    from softknn.infer.engine import Engine, InferParams
    from softknn.model.encoder import Encoder
    from softknn.storage.bundle import load_bundle

    engine = Engine(Encoder(device=device()), load_bundle(bundle_path(10_000)))  # the 10k real bundle (flat)
    typed = [{"request_id": "x" * 32, "results": engine.infer([q], InferParams(k=8, evidence=5))} for q in queries(20)]
    plain = [{**a, "results": [r.to_dict() for r in a["results"]]} for a in typed]

    def stdlib(a):  # what starlette.responses.JSONResponse.render does
        return json.dumps(a, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()

    arms = {"json": (stdlib, plain), "orjson": (orjson.dumps, plain), "orjson_typed": (orjson.dumps, typed)}
    same = all(json.loads(stdlib(p)) == json.loads(orjson.dumps(p)) == json.loads(orjson.dumps(t))
               for p, t in zip(plain, typed, strict=True))
    t = {name: [] for name in arms}
    for i in range(args.calls):
        for name, (fn, answers) in arms.items():
            a = answers[i % len(answers)]
            c0 = time.perf_counter()
            fn(a)
            t[name].append(time.perf_counter() - c0)
    row = {"answer_bytes_median": statistics.median(len(stdlib(a)) for a in plain), "same_decoded": same,
           **{f"{n}_ms_median": statistics.median(v) * 1e3 for n, v in t.items()},
           **{f"{n}_ms_min": min(v) * 1e3 for n, v in t.items()}}
    row["speedup"] = row["json_ms_median"] / row["orjson_ms_median"]
    row["typed_vs_dicts"] = row["orjson_typed_ms_median"] / row["orjson_ms_median"]
    print(json.dumps(row))
    written = write("json_encode", {"command": f"python -m bench json_encode --calls {args.calls} --threads {args.threads}",
                          "rows": [row]})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(["json (stdlib)\ndicts", "orjson\ndicts", "orjson\ntyped results"],
           [row["json_ms_median"], row["orjson_ms_median"], row["orjson_typed_ms_median"]],
           color=["#999", "#4C72B0", "#55A868"])
    ax.set_ylabel("ms per answer (median)")
    ax.set_title(f"Rendering a {row['answer_bytes_median'] / 1000:.1f} KB /v1/infer answer")
    fig.tight_layout()
    fig.savefig(RESULTS / "json_encode.png", dpi=110)
    plt.close(fig)
    return written


if __name__ == "__main__":  # python -m bench json_encode: the same as python -m bench json_encode
    import sys

    from bench.__main__ import main

    main(["json_encode", *sys.argv[1:]])
