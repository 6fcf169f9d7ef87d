"""Filters: which KB chunks a request may draw on, found without a loop.

What a filter says (its JSON tree, validated and refused) is softknn.common.filters, re-exported here;
this module evaluates one over a KB. A chunk without the field F, or whose F is a list or of another type, does
not match a leaf (so `not` of the leaf matches it). A field the KB has no chunk with, or a range
on a field with no numeric value, is refused (InvalidInput, 422), so a typo never filters silently.

`ChunkTable.of(chunks)` reads every chunk's fields once (per field: an int code per chunk for
equality, a float per chunk for ranges); `ChunkTable.mask(f)` is then a few vectorised compares
per leaf, (N,) bool. `mask_reference` evaluates the same filter chunk by chunk, the plain
reference the tests compare it with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from softknn.common.errors import InvalidInput
from softknn.common.filters import (  # noqa: F401 (re-exported: the language beside its evaluation)
    FILTER_SHAPE,
    MAX_DEPTH,
    MAX_NODES,
    MAX_VALUES,
    RANGE_OPS,
    TOP_FIELDS,
    CheckedFilter,
    Filter,
    FilterAnd,
    FilterMatch,
    FilterNode,
    FilterNot,
    FilterOr,
    check_size,
    filter_json,
    parse_filter,
)


# --- evaluation -----------------------------------------------------------------------------------
def _key(v: Any) -> tuple[str, Any] | None:
    """The typed value a field compares by: bool, number (int and float alike) or string; None for any other."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int | float):
        try:
            x = float(v)
        except OverflowError:  # an int past float range (JSON allows it): no comparable number
            return None
        return ("n", x) if math.isfinite(x) else None
    if isinstance(v, str):
        return ("s", v)
    return None


def chunk_fields(c: dict) -> dict[str, Any]:
    """A chunk's filterable fields: doc_id, chunk_id, label and metadata flattened to metadata.a.b."""
    out = {name: c.get(name) for name in TOP_FIELDS}
    stack = [("metadata", c.get("metadata") or {})]
    while stack:
        prefix, d = stack.pop()
        for k, v in d.items():
            if isinstance(v, dict):
                stack.append((f"{prefix}.{k}", v))
            else:
                out[f"{prefix}.{k}"] = v
    return out


@dataclass
class Column:
    """One field over the KB: codes (N,) int32 (−1: no comparable value), the code of each value,
    and the numeric values (N,) float64 (NaN where not a number; None when no chunk has one)."""

    codes: np.ndarray
    values: dict[tuple[str, Any], int]
    numbers: np.ndarray | None


class ChunkTable:
    """The KB's filterable fields as columns; `mask(f)` (N,) bool, the chunks that pass f."""

    def __init__(self, n: int, columns: dict[str, Column]):
        self.n, self.columns = n, columns

    @classmethod
    def of(cls, chunks: Sequence[dict]) -> ChunkTable:
        n = len(chunks)
        raw: dict[str, list[tuple[int, Any]]] = {name: [] for name in TOP_FIELDS}
        for i, c in enumerate(chunks):
            for name, v in chunk_fields(c).items():
                if v is not None:
                    raw.setdefault(name, []).append((i, v))
        columns = {}
        for name, items in raw.items():
            codes = np.full(n, -1, dtype=np.int32)
            values: dict[tuple[str, Any], int] = {}
            numbers = None
            for i, v in items:
                k = _key(v)
                if k is None:
                    continue
                codes[i] = values.setdefault(k, len(values))
                if k[0] == "n":
                    if numbers is None:
                        numbers = np.full(n, np.nan)
                    numbers[i] = k[1]
            columns[name] = Column(codes, values, numbers)
        return cls(n, columns)

    def column(self, name: str) -> Column:
        col = self.columns.get(name)
        if col is None:
            known = sorted(f for f in self.columns if f.startswith("metadata."))
            shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            raise InvalidInput(f"filter field {name!r}: no chunk of this KB has it; its metadata fields are "
                               f"{shown or 'none'}", field="filter")
        return col

    def mask(self, f: FilterNode) -> np.ndarray:
        """(N,) bool: the chunks that pass f."""
        if isinstance(f, FilterAnd):
            out = np.ones(self.n, dtype=bool)
            for g in f.and_:
                out &= self.mask(g)
            return out
        if isinstance(f, FilterOr):
            out = np.zeros(self.n, dtype=bool)
            for g in f.or_:
                out |= self.mask(g)
            return out
        if isinstance(f, FilterNot):
            return ~self.mask(f.not_)
        return self._leaf(f)

    def _leaf(self, f: FilterMatch) -> np.ndarray:
        col = self.column(f.field)
        if f.eq is not None or f.in_ is not None:
            wanted = [f.eq] if f.eq is not None else f.in_
            codes = [c for v in wanted or () if (c := col.values.get(_key(v))) is not None]  # type: ignore[arg-type]
            if not codes:
                return np.zeros(self.n, dtype=bool)
            return col.codes == codes[0] if len(codes) == 1 else np.isin(col.codes, codes)
        if col.numbers is None:
            raise InvalidInput(f"filter field {f.field!r} holds no numbers in this KB: a range (gt, gte, lt, lte) "
                               "needs a numeric field", field="filter")
        x = col.numbers
        out = ~np.isnan(x)
        for op, cmp in (("gt", np.greater), ("gte", np.greater_equal), ("lt", np.less), ("lte", np.less_equal)):
            bound = getattr(f, op)
            if bound is not None:
                out &= cmp(x, float(bound))
        return out


def mask_reference(chunks: list[dict], f: FilterNode) -> np.ndarray:
    """`ChunkTable.mask` chunk by chunk, the tree walked for each (the plain reference)."""
    def test(fields: dict[str, Any], g: FilterNode) -> bool:
        if isinstance(g, FilterAnd):
            return all(test(fields, h) for h in g.and_)
        if isinstance(g, FilterOr):
            return any(test(fields, h) for h in g.or_)
        if isinstance(g, FilterNot):
            return not test(fields, g.not_)
        k = _key(fields.get(g.field))
        if k is None:
            return False
        if g.eq is not None or g.in_ is not None:
            return k in {_key(v) for v in ([g.eq] if g.eq is not None else g.in_ or [])}
        if k[0] != "n":
            return False
        x = k[1]
        return ((g.gt is None or x > g.gt) and (g.gte is None or x >= g.gte)
                and (g.lt is None or x < g.lt) and (g.lte is None or x <= g.lte))

    return np.array([test(chunk_fields(c), f) for c in chunks], dtype=bool)
