"""Filters: which KB chunks a request may draw on, and the chunks that pass, found without a loop.

A filter is a tree of JSON objects (the `filter` field of /v1/infer, /v1/generate and the chat
completions' extension fields; `softknn query --filter JSON`):

    {"field": F, "eq": v}              the chunk's F equals v (strings, numbers, booleans; 1 = 1.0,
                                       1 ≠ "1", true ≠ 1)
    {"field": F, "in": [v, ...]}       F equals one of the values
    {"field": F, "gt"|"gte"|"lt"|"lte": x, ...}   a numeric range (one or more bounds, all must hold)
    {"and": [f, ...]}, {"or": [f, ...]}, {"not": f}

F is `doc_id`, `chunk_id`, `label` or `metadata.NAME` (a nested metadata object's keys joined by
dots: `metadata.source.kind`). A chunk without F, or whose F is a list or of another type, does
not match a leaf (so `not` of the leaf matches it). A field the KB has no chunk with, or a range
on a field with no numeric value, is refused (InvalidInput, 422), so a typo never filters silently.

`ChunkTable.of(chunks)` reads every chunk's fields once (per field: an int code per chunk for
equality, a float per chunk for ranges); `ChunkTable.mask(f)` is then a few vectorised compares
per leaf, (N,) bool. `mask_reference` evaluates the same filter chunk by chunk, the plain
reference the tests compare it with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from softknn.common.errors import InvalidInput

MAX_DEPTH = 8  # nesting of and/or/not
MAX_NODES = 64  # and/or/not/leaf objects in one filter
MAX_VALUES = 10_000  # values of all `in` lists together (a list of allowed document ids)
TOP_FIELDS = ("doc_id", "chunk_id", "label")
FIELD_PATTERN = r"^(doc_id|chunk_id|label|metadata(\.[^.]+)+)$"
RANGE_OPS = ("gt", "gte", "lt", "lte")

_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True, frozen=True)
Scalar = StrictStr | StrictBool | StrictFloat  # numbers as floats: 1 and 1.0 compare equal, 10**400 is refused
Number = StrictFloat  # strict floats take JSON integers too


def _field_name(name: str) -> str:
    if not re.fullmatch(FIELD_PATTERN, name):
        raise PydanticCustomError("unknown_filter_field", "unknown filter field '{name}': a filter field is doc_id, "
                                  "chunk_id, label or metadata.NAME", {"name": name})
    return name


FieldName = Annotated[str, AfterValidator(_field_name),
                      Field(max_length=256, json_schema_extra={"pattern": FIELD_PATTERN},
                            description="doc_id, chunk_id, label, or metadata.NAME (nested keys joined by dots)")]


class FilterMatch(BaseModel):
    """A leaf: the chunk's `field` compared with `eq`, `in`, or the range bounds."""

    model_config = _CONFIG

    field: FieldName
    eq: Scalar | None = Field(None, description="equal to this string, number or boolean")
    in_: list[Scalar] | None = Field(None, alias="in", min_length=1, description="equal to one of these values")
    gt: Number | None = None
    gte: Number | None = None
    lt: Number | None = None
    lte: Number | None = None

    @model_validator(mode="after")
    def _one_test(self) -> FilterMatch:
        ranged = any(getattr(self, op) is not None for op in RANGE_OPS)
        if (self.eq is not None) + (self.in_ is not None) + ranged != 1:
            raise PydanticCustomError("invalid_filter", "a field test takes exactly one of: eq, in, or range "
                                      "bounds (gt, gte, lt, lte)")
        return self


class FilterAnd(BaseModel):
    model_config = _CONFIG

    and_: list[Filter] = Field(alias="and", min_length=1, description="every filter holds")


class FilterOr(BaseModel):
    model_config = _CONFIG

    or_: list[Filter] = Field(alias="or", min_length=1, description="at least one filter holds")


class FilterNot(BaseModel):
    model_config = _CONFIG

    not_: Filter = Field(alias="not", description="the filter does not hold")


def _kind(v: Any) -> str | None:
    if isinstance(v, dict):
        for k in ("and", "or", "not"):
            if k in v:
                return k
        return "field" if "field" in v else None
    for cls, tag in ((FilterAnd, "and"), (FilterOr, "or"), (FilterNot, "not"), (FilterMatch, "field")):
        if isinstance(v, cls):
            return tag
    return None


FILTER_SHAPE = "a filter is {field, eq|in|gt|gte|lt|lte}, {and: [...]}, {or: [...]} or {not: {...}}"
Filter = Annotated[
    Annotated[FilterMatch, Tag("field")] | Annotated[FilterAnd, Tag("and")] | Annotated[FilterOr, Tag("or")]
    | Annotated[FilterNot, Tag("not")],
    Discriminator(_kind, custom_error_type="invalid_filter", custom_error_message=FILTER_SHAPE),
]
FilterNode = FilterMatch | FilterAnd | FilterOr | FilterNot
for _m in (FilterAnd, FilterOr, FilterNot):
    _m.model_rebuild()


def check_size(v: Any) -> Any:
    """Refuse a filter nested deeper than MAX_DEPTH, with more than MAX_NODES objects or MAX_VALUES
    `in` values, before pydantic validates it (walked with a stack: no recursion on hostile input)."""
    nodes, values, stack = 0, 0, [(v, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict):
            continue  # a wrong type: the model's error names it
        nodes += 1
        if depth > MAX_DEPTH:
            raise PydanticCustomError("filter_too_deep", f"filter nested deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise PydanticCustomError("filter_too_large", f"filter has more than {MAX_NODES} field tests and "
                                      "and/or/not objects")
        if isinstance(node.get("in"), list):
            values += len(node["in"])
            if values > MAX_VALUES:
                raise PydanticCustomError("filter_too_large", f"filter's `in` lists hold more than {MAX_VALUES} values")
        for key in ("and", "or"):
            if isinstance(node.get(key), list):
                stack += [(c, depth + 1) for c in node[key]]
        if "not" in node:
            stack.append((node["not"], depth + 1))
    return v


CheckedFilter = Annotated[Filter, BeforeValidator(check_size)]
_ADAPTER: TypeAdapter[FilterNode] = TypeAdapter(CheckedFilter)


def parse_filter(obj: Any) -> FilterNode:
    """A filter from its JSON value (the CLI's --filter), or InvalidInput naming what is wrong."""
    try:
        return _ADAPTER.validate_python(obj)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidInput(f"filter{'.' + where if where else ''}: {err['msg']}", field="filter") from None


def filter_json(f: FilterNode) -> dict:
    """The filter as JSON (its aliases: and, or, not, in), what a request sends."""
    return f.model_dump(by_alias=True, exclude_none=True)


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
