"""How the suite compares floats that two code paths (two runtimes, two CPUs, batched or not) computed.

One rule, from what a quantity is: a value of unit scale (an embedding coordinate, a weight, a
share, a cosine) is compared absolutely; a value that can be large (an effective k = exp(H), an
entropy summed over many tokens, a BM25 score) carries the same *relative* error as its inputs, so
its tolerance scales with it. Both at once: |a − b| ≤ tol · max(1, |b|). An effective k of 342 from
entropies equal to 5e-7 relative is within tol = 1e-4 of itself; a weight of 0.3 must agree to 1e-4.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def close(a: float, b: float, tol: float) -> bool:
    """|a − b| ≤ tol·max(1, |b|): absolute at unit scale, relative above it (NaN equals NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol * max(1.0, abs(b))


def assert_tree_close(a: Any, b: Any, tol: float, path: str = "result",
                      skip: Callable[[str], bool] = lambda path: False) -> None:
    """a and b (dicts, lists, scalars) have the same structure; every float is `close` at tol and
    everything else (ids, labels, ranks, flags, ints) is equal. Paths for which `skip` is true are
    not compared (a request id, say)."""
    if skip(path):
        return
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and a.keys() == b.keys(), (path, sorted(a), sorted(b) if isinstance(b, Mapping) else b)
        for k in a:
            assert_tree_close(a[k], b[k], tol, f"{path}.{k}", skip)
    elif isinstance(a, Sequence) and not isinstance(a, str):
        assert isinstance(b, Sequence) and not isinstance(b, str) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_close(x, y, tol, f"{path}[{i}]", skip)
    elif isinstance(a, float) and not isinstance(b, bool) and isinstance(b, int | float):
        assert close(float(a), float(b), tol), (path, a, b, f"tolerance {tol} x max(1, |b|)")
    else:
        assert a == b, (path, a, b)
