"""KB writes on a running server: upsert throughput (documents/s) and query p50 during a write
stream against the same server idle, side by side in one run.

    python -m bench writes [--passages 1000] [--writes 60] [--queries 40] [--threads 1]

The KB: the first --passages ObliQA passages (../shared/data/obliqa_dev/documents, one document
each, its passage id the doc id), built once (memory kv, as writes.json recorded; default flat index). A real uvicorn server
in this process (tests.harness.threaded_server, the admin token set, no background compaction)
answers /v1/infer (default hybrid retrieval, k 8) for --queries ObliQA questions idle, then again
while one client PUTs the next --writes passages as new documents back to back (each
acknowledged once its log record is fsynced). Writes bench/results/writes.json|png.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from bench.common import RESULTS, summary, write
from bench.kb import CACHE, SHARED, set_threads

ADMIN = "bench-admin-token"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--passages", type=int, default=1000, help="documents in the base KB")
    ap.add_argument("--writes", type=int, default=60, help="documents PUT during the write stream")
    ap.add_argument("--queries", type=int, default=40, help="queries per phase")
    ap.add_argument("--threads", type=int, default=1)


def passages() -> list[dict]:
    out = []
    for p in sorted((SHARED / "obliqa_dev" / "documents").glob("*.json"), key=lambda p: int(p.stem)):
        out += [{"id": str(r["ID"]), "text": r["Passage"]} for r in json.loads(p.read_text()) if r["Passage"].strip()]
    return out


def run(args: argparse.Namespace) -> dict:
    set_threads(args.threads)

    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.model.encoder import Encoder
    from softknn.params import Settings
    from softknn.service.app import create_app
    from tests.harness import threaded_server

    docs = passages()
    base, stream = docs[: args.passages], docs[args.passages : args.passages + args.writes]
    qs = [q["Question"] for q in json.loads((SHARED / "obliqa_dev" / "questions.json").read_text())][: args.queries]
    enc = Encoder()
    src = CACHE / f"writes-base-{args.passages}"
    if not (src / "manifest.json").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        kb = CACHE / f"writes-kb-{args.passages}.jsonl"
        kb.write_text("".join(json.dumps(r) + "\n" for r in base))
        build_bundle(kb, src, BuildConfig(memory="kv"), enc, force=True, progress=False)
    import softknn.service.runtime.shared

    rows = []
    for arm, nice in (("writes at niceness 10", 10), ("writes at normal priority", 0)):
        softknn.service.runtime.shared.WRITE_NICENESS = nice  # read when the app's write thread starts
        rows.append({"arm": arm, "write_niceness": nice,
                     **_arm(src, enc, args, base, stream, qs, create_app, threaded_server, Settings)})
        print(json.dumps(rows[-1], indent=1))
    cmd = f"python -m bench writes --passages {args.passages} --writes {args.writes} --queries {args.queries} --threads {args.threads}"
    written = write("writes", {"command": cmd, "rows": rows})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    labels = ["idle", "during writes", "idle after"]
    width = 0.38
    for j, row in enumerate(rows):
        vals = [row["query_ms_idle"]["p50"], row["query_ms_during_writes"]["p50"], row["query_ms_idle_after"]["p50"]]
        xs = [i + (j - 0.5) * width for i in range(3)]
        ax.bar(xs, vals, width, label=f"{row['arm']}: {row['upserts_per_s_with_queries']:.2f} upserts/s")
        for x, v in zip(xs, vals, strict=True):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(3), labels)
    ax.set_ylabel("/v1/infer p50 (ms)")
    ax.set_title(f"{rows[0]['base_chunks']}-chunk ObliQA KB, one query client and one writer", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "writes.png", dpi=110)
    plt.close(fig)
    return written


def _arm(src, enc, args, base, stream, qs, create_app, threaded_server, Settings) -> dict:
    """One server over a fresh copy of the base: queries idle, during the write stream, idle after."""
    import shutil

    work = CACHE / "writes-run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    settings = Settings(bundle=work, auth={"admin_token": ADMIN}, writes={"compact_after": 0},
                        model={"threads": args.threads})
    with threaded_server(create_app(settings, encoder=enc), timeout=300) as c:
        def query_phase() -> list[float]:
            out = []
            for q in qs:
                t0 = time.perf_counter()
                r = c.post("/v1/infer", json={"inputs": [q]})
                assert r.status_code == 200, r.text
                out.append(time.perf_counter() - t0)
            return out

        query_phase()[:2]  # warm
        idle = query_phase()
        write_s: list[float] = []
        chunks = [0]
        done = threading.Event()

        def writer() -> None:
            hdr = {"Authorization": f"Bearer {ADMIN}"}
            for d in stream:
                t0 = time.perf_counter()
                r = c.put(f"/v1/documents/{d['id']}", json={"text": d["text"]}, headers=hdr)
                assert r.status_code == 200, r.text
                write_s.append(time.perf_counter() - t0)
                chunks[0] += r.json()["chunks"]
            done.set()

        t = threading.Thread(target=writer)
        t0 = time.perf_counter()
        t.start()
        during: list[float] = []
        while not done.is_set():
            during += query_phase()
        t.join()
        wall = time.perf_counter() - t0
        idle_after = query_phase()
        final = c.get("/v1/index").json()
    row = {"base_documents": len(base), "base_chunks": final["index"]["counts"]["chunks"] - chunks[0],
           "writes": len(stream), "written_chunks": chunks[0], "final_version": final["bundle_version"],
           "upserts_per_s_with_queries": len(stream) / wall,
           "upsert_s": summary(write_s, scale=1.0),
           "query_ms_idle": summary(idle, scale=1e3), "query_ms_during_writes": summary(during, scale=1e3),
           "query_ms_idle_after": summary(idle_after, scale=1e3), "queries_during_writes": len(during)}
    row["p50_ratio_during_vs_idle"] = row["query_ms_during_writes"]["p50"] / row["query_ms_idle"]["p50"]
    return row
