"""Where a bundle is: a local directory or a URI in object storage (`s3://bucket/kb`). The settings type
their bundles with `Location`, and `softknn serve` tells a URI from a path with `is_remote`, before
numpy, torch or FAISS load; fetching and pushing is softknn.storage.remote."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints

URI_PATTERN = r"^[A-Za-z][A-Za-z0-9+.-]*://"
URI = re.compile(URI_PATTERN)
RemoteURI = Annotated[str, StringConstraints(pattern=URI_PATTERN)]
Location = Path | RemoteURI  # where a bundle is: a local directory or a URI in object storage


def is_remote(location: str | Path | None) -> bool:
    """A URI with a scheme (`s3://…`, `gs://…`, `file://…`), not a local path."""
    return isinstance(location, str) and URI.match(location) is not None
