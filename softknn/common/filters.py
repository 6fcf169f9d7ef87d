"""What a filter says: the tree of JSON objects that restricts R (the `filter` field of /v1/infer,
/v1/generate and the chat completions' extension fields; `softknn query --filter JSON`), validated
and refused here; which chunks pass it is softknn.retrieval.filters (numpy).

    {"field": F, "eq": v}              the chunk's F equals v (strings, numbers, booleans; 1 = 1.0,
                                       1 ≠ "1", true ≠ 1)
    {"field": F, "in": [v, ...]}       F equals one of the values
    {"field": F, "gt"|"gte"|"lt"|"lte": x, ...}   a numeric range (one or more bounds, all must hold)
    {"and": [f, ...]}, {"or": [f, ...]}, {"not": f}

F is `doc_id`, `chunk_id`, `label` or `metadata.NAME` (a nested metadata object's keys joined by
dots: `metadata.source.kind`). Its own module, with no numpy, so the parameter table
(softknn.common.table) can type a request's filter.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

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
