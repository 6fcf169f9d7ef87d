"""The parameter table: every parameter of an inference and of a generation, declared once.

`InferParams` (softknn query, POST /v1/infer, /v1/embeddings, /v1/rerank) and `GenParams` (softknn
generate, POST /v1/generate, /v1/chat/completions) are plain frozen dataclasses. Each field carries
its default, and as metadata its `Param`: help, bounds, deprecated names, where it is exposed; its
choices are its Literal type's. Everything else derives from them, as vLLM's EngineArgs and TEI's
`#[clap(long, env)]` do: the settings sections `defaults` and `generate` (softknn.params, and so the
docs' settings table), the HTTP request fields (softknn.service.schemas.table) and every command's
options (softknn.common.options).

A value a request or a command leaves unset is None, and `fill` takes it, in this order, from the
request, the settings (the values a settings section sets), then the bundle (`InferParams.resolved`:
its retrieval, λ and τ; the generator's calibrated k and β, softknn.generate.engine), then the
fallbacks below; `sources` says where each came from (request, settings, bundle or default).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Self, TypeVar, get_args, get_origin, get_type_hints

from softknn.common.errors import InvalidInput
from softknn.common.filters import MAX_DEPTH, MAX_NODES, MAX_VALUES, FilterNode  # noqa: F401 (FilterNode: a field's type)

# --- the choices ---------------------------------------------------------------------------------
Retrieval = Literal["hybrid", "dense", "lexical"]  # the similarity s_c of the external k-NN
Mixing = Literal["fixed", "joint"]  # seed 000 §4.3: the α rule, or one softmax over own and memory tokens
Kernel = Literal["softmax", "epanechnikov", "uniform"]  # seed 001's kernels, bandwidth h² = τ
Positions = Literal["composite", "reordered"]  # where the generator's memory tokens sit (softknn.generate.attention)
Context = Literal["memory", "prompt"]  # the KB in the generator's attention, or its chunks' text in the prompt
RETRIEVALS: tuple[str, ...] = get_args(Retrieval)
MIXING: tuple[str, ...] = get_args(Mixing)
KERNELS: tuple[str, ...] = get_args(Kernel)
POSITIONS: tuple[str, ...] = get_args(Positions)
CONTEXTS: tuple[str, ...] = get_args(Context)

# --- the fallbacks: what an unset value gets when neither the settings nor the bundle set it ---------
# The external k-NN's similarity, chosen on validation splits only (docs/quality.md, "Hybrid
# retrieval"; bench/hybrid_obliqa.py, bench/hybrid_banking77.py):
# - λ = 0.6, m = 200, with BM25 k1 = 0.9 (softknn.retrieval.lexical): ObliQA validation nDCG@10 0.716, the
#   best of 180 cells (λ 0.5: 0.709, 0.7: 0.715; m 100: 0.715), against 0.568 dense and 0.690 BM25;
# - τ: the hybrid and lexical scores lie in [0, 1] with the best at 1, a wider scale than the
#   dense cosine's top k, so their bandwidth is wider: τ 0.25 was best on average over the
#   λ × m cells of the Banking77 leave-one-out (dense: 0.05, unchanged).
# A labelled KB gets its own λ and τ by leave-one-out at build time, an unlabelled one its own λ
# from held-out sentences of its chunks (softknn.retrieval.calibration), stored in the manifest's
# calibration.retrieval_defaults; these are the fallbacks (bundles built before, too few sentences).
DEFAULT_TEMPERATURE = {"dense": 0.05, "hybrid": 0.25, "lexical": 0.25}
LEXICAL_WEIGHT = 0.6
CANDIDATES = 200
# k and β of generation for a bundle without a generator calibration: chosen together on the
# sample-KB QA validation split (docs/benchmarks.md, "Generation")
FIXED_K = 4
FIXED_PRIOR = 4.0
# τ outside [MIN_TEMPERATURE, MAX_TEMPERATURE] is refused as a mistake, not a setting: scores s lie in
# [−1, 1], so below it w_db is already one-hot and above it already uniform.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
MAX_SPANS = 256  # a chunk has at most max_seq_length tokens, so at most that many word spans


def default_mode(has_lexical: bool, calibrated: dict | None = None) -> str:
    """The retrieval a request without `retrieval` gets: hybrid where there is a lexical index,
    unless the bundle's calibration (its retrieval_defaults) chose dense alone (a labelled KB whose
    hybrid cells do not beat dense: softknn.retrieval.calibration.choose_cell)."""
    cal = calibrated or {}
    return "hybrid" if has_lexical and not ("dense" in cal and "hybrid" not in cal) else "dense"


# --- how a parameter is declared -------------------------------------------------------------------
PARAM = "softknn.param"  # the dataclass field metadata key
_SAME: Any = object()


@dataclass(frozen=True)
class Param:
    """One parameter's declaration; a dataclass field through `Param.__call__`, which is where its
    default lives (`default` here unless the field gives its own)."""

    default: Any
    description: str  # the request field's and the setting's text
    help: str = ""  # the command-line option's text; empty: the description
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    limit: str | None = None  # the setting that bounds a request's value per server, e.g. "limits.max_k"
    aliases: tuple[str, ...] = ()  # deprecated names still accepted (request field, option, setting)
    name: str | None = None  # the name requests, options and settings use, where the attribute's differs
    setting: bool = True  # also a setting (a field of the dataclass's settings section)
    request: bool = True  # a request field
    option: bool = True  # a command-line option
    flags: tuple[str, ...] = ()  # the option's flags, where not --NAME (a bool: "--on/--off")

    def __call__(self, default: Any = _SAME, **changes: Any) -> Any:
        p = replace(self, **changes) if changes else self
        return field(default=p.default if default is _SAME else default, metadata={PARAM: p})

    def bounds(self) -> dict[str, float]:
        return {b: v for b in ("ge", "gt", "le", "lt") if (v := getattr(self, b)) is not None}


@dataclass(frozen=True)
class Entry:
    """One parameter of a dataclass as the derivations read it: the attribute, its public name, its
    type (Optional removed), whether it may be None, its default and its Param."""

    attr: str
    name: str
    type: Any
    optional: bool
    default: Any
    param: Param

    @property
    def choices(self) -> tuple[str, ...] | None:
        return get_args(self.type) if get_origin(self.type) is Literal else None


@functools.cache
def entries(cls: type) -> tuple[Entry, ...]:
    """The table's parameters of dataclass `cls`, in field order (fields without a Param are internal)."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        p = f.metadata.get(PARAM)
        if p is None:
            continue
        t = hints[f.name]
        args = get_args(t)
        optional = type(None) in args
        if optional:
            rest = tuple(a for a in args if a is not type(None))
            t = rest[0] if len(rest) == 1 else functools.reduce(lambda a, b: a | b, rest)
        out.append(Entry(f.name, p.name or f.name, t, optional, f.default, p))
    return tuple(out)


def entry(cls: type, name: str) -> Entry:
    """The parameter `name` (public or attribute name) of `cls`."""
    for e in entries(cls):
        if name in (e.name, e.attr):
            return e
    raise KeyError(f"{cls.__name__} has no parameter {name!r}")


def interval(p: Param) -> str:
    """p's bounds in words: "in [0, 1]", "≥ 1", "in (0, 1]"; "" without bounds."""
    lo = f"[{p.ge:g}" if p.ge is not None else f"({p.gt:g}" if p.gt is not None else None
    hi = f"{p.le:g}]" if p.le is not None else f"{p.lt:g})" if p.lt is not None else None
    if lo and hi:
        return f"in {lo}, {hi}"
    if lo:
        return f"≥ {p.ge:g}" if p.ge is not None else f"> {p.gt:g}"
    if hi:
        return f"≤ {p.le:g}" if p.le is not None else f"< {p.lt:g}"
    return ""


def check(e: Entry, value: Any) -> None:
    """Refuse `value` for parameter `e` outside its bounds or choices: InvalidInput naming it."""
    if value is None:
        if not e.optional:
            raise InvalidInput(f"{e.name} must be set", field=e.name)
        return
    if e.choices is not None and value not in e.choices:
        raise InvalidInput(f"{e.name} must be one of {e.choices}, got {value!r}", field=e.name)
    p = e.param
    if not p.bounds() or isinstance(value, bool) or not isinstance(value, int | float):
        return
    ok = not math.isnan(value) and all((p.ge is None or value >= p.ge, p.gt is None or value > p.gt,
                                        p.le is None or value <= p.le, p.lt is None or value < p.lt))
    if not ok:
        raise InvalidInput(f"{e.name} must be {interval(p)}, got {value}", field=e.name)


T = TypeVar("T")


def validated(obj: T) -> T:
    """`obj` (a parameter dataclass) with every table parameter checked (`check`)."""
    cls: Any = type(obj)
    for e in entries(cls):
        check(e, getattr(obj, e.attr))
    return obj


def explicit(section: Any) -> dict[str, Any]:
    """The values a settings section sets (pydantic's fields_set: from the environment or the
    arguments), not its declared defaults; a mapping as it is."""
    if section is None:
        return {}
    if isinstance(section, Mapping):
        return dict(section)
    return {n: getattr(section, n) for n in section.model_fields_set}


def fill(cls: Any, given: Mapping[str, Any], settings: Any = None) -> Any:
    """`cls` with each parameter from `given` (a request's or a command's values, by public or
    attribute name) where not None, else from `settings` (what a settings section sets: `explicit`),
    else its default; validated, `sources` naming where each value came from. A given deprecated
    name (Param.aliases) counts as its parameter's, refused when both are given and differ."""
    given = merge_aliases(cls, given)
    from_settings = explicit(settings)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for e in entries(cls):
        for where, src in (("request", given), ("settings", from_settings)):
            v = src.get(e.name, src.get(e.attr))
            if v is not None:
                values[e.attr], sources[e.name] = v, where
                break
        else:
            sources[e.name] = "default"
    internal = {f.name for f in fields(cls)} - {e.attr for e in entries(cls)}
    values |= {n: v for n, v in given.items() if n in internal and v is not None}
    return validated(cls(**values, sources=tuple(sources.items())))


def merge_aliases(cls: type, given: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """`given` with each deprecated name's value moved to its parameter's name; both given with
    different values: InvalidInput naming the old one (`where` prefixes it, e.g. 'softknn.')."""
    out = dict(given)
    for e in entries(cls):
        for alias in e.param.aliases:
            old = out.pop(alias, None)
            if old is None:
                continue
            new = out.get(e.name)
            if new is not None and new != old:
                raise InvalidInput(f"{where}{alias} is a deprecated name of {where}{e.name} and the two differ "
                                   f"({old!r} vs {new!r}): send {where}{e.name} only", field=f"{where}{alias}")
            out[e.name] = old
    return out


def with_sources(p: Any, **more: str) -> Any:
    """`p` with `sources` updated by `more` (name → where the value came from)."""
    return replace(p, sources=tuple({**dict(p.sources), **more}.items()))


# --- the parameters --------------------------------------------------------------------------------
_ALPHA = Param(0.7, "fixed mixing: weight of the input's own attention, out = α·attn_intra + (1−α)·attn_db "
              "(seed 000 §4.3); ignored by joint mixing", "fixed-mixing weight of the input's own attention",
              ge=0, le=1)
_MIXING = Param("fixed", "fixed: the α rule; joint: one softmax over input and retrieved tokens (memory share is "
                "reported)")
_K = Param(8, "KB chunks retrieved by the external k-NN", "chunks retrieved", ge=1, limit="limits.max_k")
_TAU = Param(None, "k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel (h² = τ for the others); null = the "
            "bundle's calibrated τ, else the retrieval's own default (docs/quality.md)", "k-NN bandwidth τ",
            ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
_RETRIEVAL = Param(None, "similarity s_c of the external k-NN: dense e_q·e_c, lexical BM25, or hybrid "
                   "(1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid where the "
                   "bundle has a lexical index, else dense",
                   "the k-NN's similarity (default: hybrid where the bundle has a lexical index, else dense)")
_LAMBDA = Param(None, "λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the bundle's build chose "
               f"(labelled KBs by leave-one-out, unlabelled by pseudo-queries), else {LEXICAL_WEIGHT}",
               "λ of the hybrid similarity (1−λ)·dense + λ·BM25", ge=0, le=1)
_EXACT = Param(False, "exact (brute-force) search instead of the ANN index; with hybrid or lexical retrieval, the "
              "similarity computed over every chunk", "exact search (bypass the ANN index)", setting=False)
_EVIDENCE = Param(5, "evidence items returned per input", "evidence items per input", ge=0, limit="limits.max_evidence")
_SPANS = Param(5, "highlighted word spans per evidence item", ge=0, le=MAX_SPANS)
_FILTER = Param(None, "R is drawn from the chunks that pass this filter only: {field, eq|in|gt|gte|lt|lte} on doc_id, "
                "chunk_id, label or metadata.NAME, combined with {and: [...]}, {or: [...]}, {not: ...}; "
                f"≤ {MAX_DEPTH} levels, ≤ {MAX_NODES} objects, ≤ {MAX_VALUES} `in` values; null = every chunk",
                "JSON filter: R is drawn from the chunks that pass it, e.g. '{\"field\": \"label\", \"in\": [\"a\", "
                "\"b\"]}' (docs/design.md, Filters)", setting=False)


class Params:
    """What both parameter dataclasses do with their table."""

    @classmethod
    def from_defaults(cls, defaults: Any, **given: Any) -> Self:
        """`fill` with a settings section (`Settings.defaults`, `Settings.generate`)."""
        out: Self = fill(cls, given, defaults)
        return out

    def validate(self) -> Self:
        """Every parameter within its bounds and choices, or InvalidInput naming it."""
        return validated(self)


@dataclass(frozen=True)
class InferParams(Params):
    """One input's parameters of knowledge-augmented inference (softknn.infer.engine.Engine.infer)."""

    alpha: float = _ALPHA()  # seed 000 §4.3: internal attention is the more reliable, the KB a supplement
    mixing: Mixing = _MIXING()
    k: int = _K()
    temperature: float | None = _TAU(name="knn_temperature", aliases=("temperature",))  # τ; None: see resolved
    kernel: Kernel = Param("softmax", "k-NN kernel (seed 001), bandwidth h² = τ")()
    exact: bool = _EXACT()
    threshold: float | None = Param(None, "top-k + threshold: also keep chunks of the hybrid_pool candidates whose "
                                    "weight is ≥ threshold (seed 000 §5.3)",
                                    "top-k + threshold: also keep pool chunks with w ≥ threshold", gt=0, lt=1,
                                    setting=False)()
    hybrid_pool: int = Param(64, "candidates searched when a threshold is set", ge=1, request=False, option=False)()
    evidence: int = _EVIDENCE()
    spans: int = _SPANS()
    return_tokens: bool = Param(False, "also return per-token outputs: tokens, token_embeddings, head_memory_share, "
                                "and versus_plain (the change against the plain model)",
                                "also return per-token outputs", setting=False, flags=("--tokens/--no-tokens",))()
    truncate: bool = Param(False, "cut inputs over the character or token limit instead of refusing them (413)",
                           "cut inputs longer than the model's limit", setting=False)()
    abstain_threshold: float | None = None  # None: the bundle's calibrated value (internal: softknn eval)
    retrieval: Retrieval | None = _RETRIEVAL()  # None: see resolved
    lexical_weight: float | None = _LAMBDA()  # None: see resolved
    candidates: int = Param(CANDIDATES, "hybrid/lexical: each retriever's top m, the candidates and the range of "
                            "its normalisation", "each retriever's top m (hybrid/lexical)", ge=1, request=False,
                            option=False)()
    filter: FilterNode | None = _FILTER()  # the chunks R may come from (softknn.retrieval.filters); None: every chunk
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # `fill`: where each value came from

    def resolved(self, has_lexical: bool, calibrated: dict | None = None) -> ResolvedParams:
        """With `retrieval`, `temperature` and `lexical_weight` filled in for a bundle with or without
        a lexical index; `calibrated`: the bundle's calibration.retrieval_defaults (softknn.retrieval.calibration)."""
        mode = self.retrieval or default_mode(has_lexical, calibrated)
        if mode != "dense" and not has_lexical:
            raise InvalidInput(f"retrieval {mode!r} needs a lexical index, and this bundle was built without one "
                               "(`softknn add-lexical` adds it); use retrieval 'dense'", field="retrieval")
        own = (calibrated or {}).get(mode, {})
        src = dict(self.sources)
        got: dict[str, Any] = {"retrieval": mode}
        if self.retrieval is None:
            src["retrieval"] = "bundle"
        for attr, name, key, fallback in (("temperature", "knn_temperature", "temperature", DEFAULT_TEMPERATURE[mode]),
                                          ("lexical_weight", "lexical_weight", "lexical_weight", LEXICAL_WEIGHT)):
            if getattr(self, attr) is None:
                got[attr] = own.get(key, fallback)
                src[name] = "bundle" if key in own else "default"
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return ResolvedParams(**{**values, **got, "sources": tuple(src.items())})

    def search_size(self, n: int) -> int:
        """How many ranked chunks R is chosen from: k, or the pool when a threshold is set (≤ n)."""
        return min(n, max(self.k, self.hybrid_pool) if self.threshold is not None else self.k)


@dataclass(frozen=True, kw_only=True)
class ResolvedParams(InferParams):
    """InferParams as a bundle serves them (InferParams.resolved): the retrieval, its temperature
    and λ are set, so the retrieval code reads them without a None check."""

    temperature: float
    retrieval: Retrieval
    lexical_weight: float


@dataclass(frozen=True)
class GenParams(Params):
    """One generation's parameters: sampling, retrieval (as InferParams'), and how the memory is mixed."""

    max_tokens: int = Param(64, "tokens generated at most", ge=1, limit="generator.max_tokens")()
    temperature: float = Param(0.0, "sampling temperature; 0 = greedy (the default here, unlike OpenAI's 1)",
                               ge=0, le=100)()
    top_p: float = Param(1.0, "nucleus sampling: the smallest set of tokens whose probability reaches top_p",
                         gt=0, le=1)()
    stop: tuple[str, ...] = Param((), "a string or up to 16 strings; the answer ends before the first",
                                  setting=False)()
    seed: int | None = Param(None, "seed of the sampler (temperature > 0): the same seed, the same answer",
                             setting=False)()
    ignore_eos: bool = Param(False, "true: decode max_tokens tokens, past the model's end of answer (vLLM's and "
                             "llama-server's ignore_eos; for benchmarks)", setting=False)()
    k: int | None = _K(None, description="KB chunks retrieved and placed in the generator's attention; null = the "
                      "bundle's own (chosen at build time from its pseudo-questions: GET /v1/index "
                      f"generator.calibration), else {FIXED_K}")
    retrieval: Retrieval | None = _RETRIEVAL()
    lexical_weight: float | None = _LAMBDA()
    knn_temperature: float | None = _TAU()  # τ of w_db
    exact: bool = _EXACT(description="exact search, and the chunks' keys/values recomputed in float32 after this "
                        "prompt's own prefix (the masked-concatenation contract)")
    mixing: Mixing = _MIXING("joint")
    alpha: float = _ALPHA()  # fixed mixing only
    prior: float | None = Param(None, "joint mixing only: β of the k-NN prior, each chunk's share of the one softmax "
                                "times (k·w_db(c))^β; 0 = the plain joint softmax; null = the bundle's own (as k), "
                                f"else {FIXED_PRIOR:g}", "joint mixing: β of the w_db prior on each chunk", ge=0,
                                le=16)()
    positions: Positions = Param("composite", "rotary placement of the chunks: side by side (composite) or one after "
                                 "another")()
    use_kb: bool = Param(True, "false: the plain model, no retrieval", "the KB (--no-kb: the plain model)",
                         setting=False, flags=("--kb/--no-kb",))()
    context: Context = Param("memory", "memory: the KB in attention; prompt: the same chunks' text in the prompt (the "
                             "RAG baseline)")()
    evidence: int = _EVIDENCE()
    spans: int = _SPANS()
    filter: FilterNode | None = _FILTER()  # the chunks R may come from (softknn.retrieval.filters)
    refuse: bool = Param(True, "true: a question whose nearest KB chunk is less similar than the bundle's refusal "
                         "threshold (GET /v1/index generator.calibration.refusal) gets the refusal text and grounded "
                         "false, nothing decoded; false: answered anyway (grounded still reported)",
                         "refuse a question whose nearest KB chunk is below the bundle's refusal threshold (the "
                         "refusal text, nothing decoded); --no-refuse answers anyway")()
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # `fill`: where each value came from


def table(cls: type) -> list[dict[str, Any]]:
    """The table of `cls` as rows (docs, tests): name, default, bounds, choices, description."""
    return [{"name": e.name, "default": e.default, **e.param.bounds(), "choices": e.choices,
             "description": e.param.description} for e in entries(cls)]

