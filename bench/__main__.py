"""One runner for the benchmark suite: `python -m bench NAME [flags]`, from the repository root.

Each benchmark is a module bench/NAME.py with `add_cli_args(parser)` (its flags) and
`run(args) -> dict` (the figure it writes under bench/results/, returned). `python -m bench NAME
--help` shows a benchmark's flags; `python -m bench.NAME ...` is the same command. What each one
measures, how, and the figures: docs/benchmarks.md (and docs/quality.md, docs/reliability.md).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import shlex
import sys
from pathlib import Path

BENCHMARKS = (  # the order of `python -m bench --help`
    "kb", "fused_forward", "evidence_cost", "service", "profile_service", "profile_infer", "ann", "builder_throughput", "limits",
    "scaling", "hybrid_cost", "grouping", "json_encode", "qkv_reuse", "attack", "hybrid_obliqa", "hybrid_banking77",
    "obliqa_prepare", "sweep_banking77", "sweep_obliqa", "ray_shards", "runtime", "runtime_pipeline",
    "runtime_exact", "memory_repr", "generation", "contention", "embeddings", "writes", "filters",
    "question_words", "unlabelled_lambda", "ray_http", "shard_scaling", "oos_refusal", "chunk_metadata",
    "build_update", "gen_serving", "profile_decode", "step_split", "attention_kernel", "gen_blend", "gen_quality", "obliqa_generator", "gen_refusal", "gen_build",
    "chunk_layout",
)
HERE = Path(__file__).resolve().parent


def describe(name: str) -> str:
    """The first paragraph of bench/NAME.py's docstring, on one line (read without importing it)."""
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def top_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<19} {describe(name)}" for name in BENCHMARKS)
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__, epilog=f"benchmarks:\n{listing}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", metavar="NAME", help="the benchmark to run (listed below)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its flags (python -m bench NAME --help)")
    return ap


def bench_parser(name: str, module) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m bench {name}", description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_cli_args(ap)
    return ap


def main(argv: list[str] | None = None) -> dict:
    """Parse `NAME [flags]`, run the benchmark; its result dict. `args.command` is the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = top_parser()
    if not argv or argv[0].startswith("-"):
        top.parse_args(argv)  # --help, or the usage error (NAME is required)
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        top.error(f"unknown benchmark {name!r}; one of: {', '.join(BENCHMARKS)}")
    module = importlib.import_module(f"bench.{name}")
    args = bench_parser(name, module).parse_args(rest)
    args.command = shlex.join(["python", "-m", "bench", name, *rest])
    return module.run(args)


if __name__ == "__main__":
    main()
