"""What a KB may be named (`--bundle NAME=DIR`, SOFTKNN_BUNDLES, a request's `kb`). Its own module,
importing nothing heavy: `softknn serve` splits its --bundle values with it before anything loads."""

from __future__ import annotations

import re

KB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_KB = "default"
