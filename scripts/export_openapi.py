"""Write the service's OpenAPI document (openapi.json at the repository root), deterministically.

    python -m scripts.export_openapi                 # writes openapi.json
    python -m scripts.export_openapi --out FILE      # elsewhere ('-' = stdout)
    python -m scripts.export_openapi --check         # exit 1 when openapi.json differs from the app

The app is built with `create_app(Settings())` at the defaults, SOFTKNN_* variables ignored (the
request schema bakes in limits and defaults, so a developer's environment must not leak into the
committed file). No model is loaded: `app.openapi()` only walks the routes; the lifespan never runs.
The text is JSON with sorted keys, two-space indent, UTF-8 and one trailing newline; it holds no
volatile value (no time, no path, no host). tests/deploy/test_openapi_drift.py compares it with the
committed file; scripts/gen_client.sh generates clients/python/ from it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "openapi.json"


@contextlib.contextmanager
def _no_softknn_env() -> Iterator[None]:
    """Hide SOFTKNN_* variables while Settings is built (restored afterwards)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.upper().startswith("SOFTKNN_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def build_spec() -> dict:
    """The app's OpenAPI document at default settings, as a dict."""
    from softknn.params import Settings
    from softknn.service.app import create_app

    with _no_softknn_env():
        settings = Settings()
    return create_app(settings).openapi()


def spec_text(spec: dict | None = None) -> str:
    """The canonical text of the document: sorted keys, indent 2, UTF-8 kept, trailing newline."""
    return json.dumps(build_spec() if spec is None else spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(SPEC_PATH), help="file to write ('-' = stdout); default openapi.json")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    text = spec_text()
    if args.check:
        current = Path(args.out).read_text(encoding="utf-8") if Path(args.out).is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run `bash scripts/gen_client.sh` (spec and client)", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    print(f"wrote {out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
