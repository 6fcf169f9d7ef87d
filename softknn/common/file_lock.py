"""An exclusive advisory lock on a file (flock), for the processes of one machine that fill the same
cache: ONNX exports (softknn.model.onnx_forward), bundles fetched from object storage (softknn.storage.remote)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created, with its folder, if absent); none where fcntl is
    absent (not POSIX): writers there still write atomically, two may just both do the work."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
