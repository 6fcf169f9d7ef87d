"""`python -m tests.reliability.fault_server --bundle B --port P`: the real service with one test-only fault.

The same as `softknn serve` (softknn/service/cli.py): Settings from SOFTKNN_* variables, create_app, JSON
logs, uvicorn with the same graceful shutdown; except that the inference worker raises on any
micro-batch holding a text that contains FAULT_MARKER, as a bug in the core would. The fault is
installed from outside, by wrapping the app's batcher runner after create_app (as
tests/service/test_concurrency.py does in process), so nothing of it exists in softknn/service/ or in any
production entry point. tests/reliability/test_faults.py drives it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FAULT_MARKER = "<<softknn-test-fault>>"


def install_fault(app) -> None:
    batcher = app.state.runtime.batcher
    real = batcher.runner

    def runner(engine, texts, params):
        if any(FAULT_MARKER in t for t in texts):
            raise RuntimeError("injected fault (tests/reliability/fault_server.py)")
        return real(engine, texts, params)

    batcher.runner = runner


def main() -> None:
    import uvicorn

    from softknn.params import Settings
    from softknn.service.app import create_app
    from softknn.service.logs import configure_logging
    from softknn.service.server import uvicorn_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args()
    settings = Settings(bundle=args.bundle, port=args.port, log_level=args.log_level)
    app = create_app(settings)
    install_fault(app)
    configure_logging(settings.log_level)
    uvicorn.Server(uvicorn_config(app, host=settings.host, port=settings.port,
                                  log_level=settings.log_level.lower(), timeout_graceful_shutdown=10)).run()


if __name__ == "__main__":
    main()
