"""The one Settings object: built once at each entry point (CLI, service) and passed down.

Every field is also an environment variable: prefix `SOFTKNN_`, nested sections joined by `__`
(e.g. `SOFTKNN_DEFAULTS__ALPHA=0.5`, `SOFTKNN_AUTH__API_KEY=...`). docs/usage.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from softknn.common.kb_names import DEFAULT_KB, KB_NAME  # noqa: F401 (re-exported)
from softknn.retrieval.defaults import CANDIDATES, LEXICAL_WEIGHT
from softknn.storage.remote import Location

MAX_SPANS = 256  # a chunk has at most max_seq_length tokens, so at most that many word spans


class ModelSettings(BaseModel):
    name: str | None = Field(None, description="sentence-transformers model path; empty = packaged all-MiniLM-L6-v2")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when visible, else cpu")
    threads: int = Field(0, ge=0, description="torch, faiss and ONNX Runtime intra-op threads; 0 = auto: 1 per "
                         "inference worker in the service (more spin against the event loop on a busy box: "
                         "docs/benchmarks.md, contention), the CPU cores for build and the other commands")
    runtime: Literal["auto", "torch", "onnx"] = Field(
        "auto", description="what runs the plain forward and the layers before the memory layer: onnx (ONNX Runtime, "
        "CPU; exported once per model and cached, verified against torch within 1e-4 at every start, refusing to "
        "start otherwise), torch, or auto: onnx fp32 where it opens and passes that verification, else torch with "
        "the reason in /v1/index `runtime.fallback` and the log (docs/benchmarks.md); `softknn build` runs "
        "torch under auto (the same bundle bytes wherever it is built)")
    precision: Literal["fp32", "int8"] = Field("fp32", description="int8 = dynamic quantisation, onnx only, opt-in: "
                                               "quality cost in docs/benchmarks.md; bundles must be built with the same")
    onnx_cache: Path | None = Field(None, description="where ONNX exports are cached; empty = "
                                    "$XDG_CACHE_HOME/softknn/onnx (~/.cache/softknn/onnx)")
    onnx_optimization: Literal["basic", "extended", "all"] = Field("all", description="ONNX Runtime graph optimisation level")

    @model_validator(mode="after")
    def _runtime_precision(self):
        if self.precision != "fp32" and self.runtime != "onnx":
            raise ValueError(f"model.precision={self.precision} needs model.runtime=onnx")
        return self


# --- the retrieval and mixing parameters: one table ----------------------------------------------
# Every declaration of these parameters is built from PARAMS: the settings section `defaults`
# (InferDefaults), the request fields of /v1/infer, /v1/embeddings, /v1/rerank and the retrieval
# fields of /v1/generate (param_field), and the CLI options of `query` and `eval` (param_option).
# τ outside [MIN_TEMPERATURE, MAX_TEMPERATURE] is refused as a mistake, not a setting: scores s lie in
# [−1, 1], so below it w_db is already one-hot and above it already uniform.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
TAU_DEPRECATED = "deprecated: use knn_temperature"


@dataclass(frozen=True)
class Param:
    """One retrieval/mixing parameter: its name, type, default, bounds, choices, texts and old names."""

    name: str
    type: Any
    default: Any
    description: str
    help: str  # the CLI option's help
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # deprecated names still accepted (request field, CLI option, env var)
    setting: bool = True  # also a setting (InferDefaults, SOFTKNN_DEFAULTS__NAME); False: per request only

    def bounds(self) -> dict[str, float]:
        return {b: v for b in ("ge", "gt", "le", "lt") if (v := getattr(self, b)) is not None}


def _p(name, type_, default, description, help, **kw) -> tuple[str, Param]:
    return name, Param(name, type_, default, description, help, **kw)


PARAMS: dict[str, Param] = dict([
    _p("alpha", float, 0.7, "fixed mixing: weight of the input's own attention, out = α·attn_intra + "
       "(1−α)·attn_db (seed 000 §4.3); ignored by joint mixing", "fixed-mixing weight of the input's own attention",
       ge=0, le=1),
    _p("mixing", Literal["fixed", "joint"], "fixed", "fixed: the α rule; joint: one softmax over input and "
       "retrieved tokens (memory share is reported)", "fixed | joint", choices=("fixed", "joint")),
    _p("k", int, 8, "KB chunks retrieved by the external k-NN", "chunks retrieved", ge=1),
    _p("knn_temperature", float | None, None, "k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel "
       "(h² = τ for the others); null = the retrieval's own default (docs/quality.md)", "k-NN bandwidth τ",
       ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, aliases=("temperature",)),
    _p("retrieval", Literal["hybrid", "dense", "lexical"] | None, None, "similarity s_c of the external k-NN: "
       "dense e_q·e_c, lexical BM25, or hybrid (1−λ)·dense + λ·BM25, each min-max normalised over its top "
       "candidates; null = hybrid where the bundle has a lexical index, else dense",
       "hybrid | dense | lexical (default: hybrid where the bundle has a lexical index, else dense)",
       choices=("hybrid", "dense", "lexical")),
    _p("lexical_weight", float | None, None, "λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the "
       f"bundle's build chose (labelled KBs by leave-one-out, unlabelled by pseudo-queries), else {LEXICAL_WEIGHT}",
       "λ of the hybrid similarity (1−λ)·dense + λ·BM25", ge=0, le=1),
    _p("candidates", int, CANDIDATES, "hybrid/lexical: each retriever's top m, the candidates and the range of its "
       "normalisation", "each retriever's top m (hybrid/lexical)", ge=1),
    _p("kernel", Literal["softmax", "epanechnikov", "uniform"], "softmax", "k-NN kernel (seed 001), bandwidth h² = τ",
       "softmax | epanechnikov | uniform", choices=("softmax", "epanechnikov", "uniform")),
    _p("exact", bool, False, "exact (brute-force) search instead of the ANN index; with hybrid or lexical "
       "retrieval, the similarity computed over every chunk", "exact search (bypass the ANN index)", setting=False),
    _p("threshold", float | None, None, "top-k + threshold: also keep chunks of the hybrid_pool candidates whose "
       "weight is ≥ threshold", "top-k + threshold: also keep pool chunks with w ≥ threshold", gt=0, lt=1,
       setting=False),
    _p("evidence", int, 5, "evidence items returned per input", "evidence items per input", ge=0),
    _p("spans", int, 5, "highlighted word spans per evidence item", "highlighted word spans per evidence item",
       ge=0, le=MAX_SPANS),
    _p("hybrid_pool", int, 64, "candidates searched when a threshold is set", "candidates searched with a threshold",
       ge=1),
])

_UNSET: Any = object()


def param_field(name: str, default: Any = _UNSET, *, description: str | None = None, **more: Any) -> Any:
    """The pydantic Field of parameter `name` from PARAMS: its default (or `default`), its bounds (a
    bound in `more` replaces the table's, e.g. le=limits.max_k; None drops it), its description, and
    any other Field arguments in `more`."""
    p = PARAMS[name]
    b: dict[str, Any] = {**p.bounds(), **more}  # Field's keyword arguments
    return Field(p.default if default is _UNSET else default, description=description or p.description,
                 **{k: v for k, v in b.items() if v is not None})


def alias_field(name: str, alias: str) -> Any:
    """The request field of a deprecated name of `name` (PARAMS[name].aliases): the same bounds, no
    default, `deprecated: true` in the OpenAPI document."""
    p = PARAMS[name]
    assert alias in p.aliases, (name, alias)
    return Field(None, description=f"{TAU_DEPRECATED if name == 'knn_temperature' else 'deprecated: use ' + name}",
                 json_schema_extra={"deprecated": True}, **p.bounds())  # type: ignore[call-overload]


def merge_alias(model: Any, name: str, alias: str, where: str = "") -> None:
    """After validation (each name checked against its own bounds, so an error names the field sent):
    the deprecated `alias` given → `name`; both given with different values → InvalidInput (422).
    `where` prefixes the field in the error (e.g. 'softknn.')."""
    from softknn.common.errors import InvalidInput

    old = getattr(model, alias)
    if old is None:
        return
    new = getattr(model, name)
    if name in model.model_fields_set and new is not None and new != old:
        raise InvalidInput(f"{where}{alias} is a deprecated name of {where}{name} and the two differ "
                           f"({old!r} vs {new!r}): send {where}{name} only", field=f"{where}{alias}")
    setattr(model, name, old)


def param_option(name: str, *decls: str, hidden: bool = False, help: str | None = None) -> Any:
    """The typer Option of parameter `name` from PARAMS (its help; `decls`: other flag names)."""
    import typer

    return typer.Option(*decls, help=help or PARAMS[name].help, hidden=hidden)


def cli_tau(knn_temperature: float | None, temperature: float | None) -> float | None:
    """--knn-temperature, or its hidden deprecated alias --temperature; both, differing: InvalidInput."""
    from softknn.common.errors import InvalidInput

    if temperature is not None and knn_temperature is not None and temperature != knn_temperature:
        raise InvalidInput(f"--temperature is a deprecated name of --knn-temperature and the two differ "
                           f"({temperature} vs {knn_temperature}): give --knn-temperature only", field="temperature")
    return knn_temperature if knn_temperature is not None else temperature


TAU_ALIAS_HELP = "deprecated: use --knn-temperature"


class InferDefaults(BaseModel):
    """The settings section `defaults` (SOFTKNN_DEFAULTS__*): PARAMS' defaults, bounds and descriptions."""

    alpha: float = param_field("alpha")
    mixing: Literal["fixed", "joint"] = param_field("mixing")
    k: int = param_field("k")
    knn_temperature: float | None = param_field("knn_temperature", validation_alias=AliasChoices(
        "knn_temperature", *PARAMS["knn_temperature"].aliases))  # SOFTKNN_DEFAULTS__TEMPERATURE still read
    retrieval: Literal["hybrid", "dense", "lexical"] | None = param_field("retrieval")
    lexical_weight: float | None = param_field("lexical_weight")
    candidates: int = param_field("candidates")
    kernel: Literal["softmax", "epanechnikov", "uniform"] = param_field("kernel")
    evidence: int = param_field("evidence")
    spans: int = param_field("spans")
    hybrid_pool: int = param_field("hybrid_pool")


class Limits(BaseModel):
    max_inputs: int = Field(64, ge=1, description="texts per request")
    max_chars: int = Field(20_000, ge=1, description="characters per text")
    max_tokens: int | None = Field(None, description="tokens per text; default the model's max_seq_length")
    max_k: int = Field(256, ge=1, description="largest k a request may ask for")
    max_evidence: int = Field(50, ge=0, description="most evidence items a request may ask for")
    max_body_bytes: int = Field(2_000_000, ge=1024, description="request body size")
    body_timeout_s: float = Field(30.0, gt=0, description="seconds a client may take to send a request body; then 408")
    linger_idle_s: float = Field(5.0, ge=0, description="lingering close (an answer sent before the client stopped "
                                 "sending, e.g. a 408): keep reading and dropping what it still sends, closing after "
                                 "this many seconds with nothing arriving (nginx's lingering_timeout); 0 = close at once")
    linger_total_s: float = Field(30.0, gt=0, description="lingering close: the most seconds one connection lingers in "
                                  "all, however steadily the client sends (nginx's lingering_time)")
    linger_max_connections: int = Field(1024, ge=0, description="connections lingering at once; past it a connection "
                                        "closes at once (counted: softknn_lingering_closes_total{reason=\"full\"})")


class Batching(BaseModel):
    max_batch_tokens: int = Field(4096, ge=1, description="padded tokens per micro-batch")
    max_batch_size: int = Field(32, ge=1, description="texts per micro-batch")
    group_size: int = Field(4, ge=1, description="texts per forward pass: a micro-batch runs in passes of texts of similar length")
    workers: int = Field(1, ge=1, le=64, description="inference worker threads, each running one micro-batch at a "
                         "time with model.threads threads (1 by default)")
    max_wait_ms: float = Field(0.0, ge=0, description="how long the worker waits to fill a batch (0: take what is queued)")
    queue_size: int = Field(256, ge=1, description="texts waiting; beyond it requests get 429")
    request_timeout_s: float = Field(30.0, gt=0, description="a request waiting longer gets 503")




class ScopedKey(BaseModel):
    """One bearer key limited to some KBs and to reading, or reading and writing (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")

    key: SecretStr = Field(description="the bearer token")
    kbs: list[str] = Field(min_length=1, description='KB names the key may use; ["*"] = every KB')
    scopes: list[Literal["read", "write"]] = Field(["read"], description='["read"] or ["read", "write"]')

    @model_validator(mode="after")
    def _scopes(self):
        if "read" not in self.scopes:
            raise ValueError(f"a key's scopes must include read: {self.scopes}")
        if len(self.key.get_secret_value()) < 8:
            raise ValueError("a scoped key must be at least 8 characters")
        return self


class Auth(BaseModel):
    api_key: SecretStr | None = Field(None, description="bearer key for /v1/* reads of every KB; unset (and no "
                                      "`keys`) = reads open")
    admin_token: SecretStr | None = Field(None, description="bearer token for /v1/admin/* and KB writes, every KB; "
                                          "unset = admin off")
    keys: list[ScopedKey] = Field(default_factory=list, description='keys scoped to KBs, JSON: [{"key": "...", '
                                  '"kbs": ["faq"], "scopes": ["read", "write"]}] (docs/security.md); any key set '
                                  "closes /v1/* reads to callers without one")

    @property
    def reads_open(self) -> bool:
        """No API key and no scoped key: /v1/* reads need no token (as before keys existed)."""
        return self.api_key is None and not self.keys


class Writes(BaseModel):
    compact_after: int = Field(1000, ge=0, description="KB writes (PUT/DELETE /v1/documents) logged before a "
                                                        "background compaction folds them into a new base bundle; "
                                                        "0 = only on POST /v1/admin/compact")


class GeneratorSettings(BaseModel):
    name: str | None = Field(None, description="causal LM for /v1/generate: smollm2-135m-instruct, a folder or a "
                                               ".gguf file; unset = the one the bundle's generator memory was built with")
    cache_dir: Path | None = Field(None, description="where a GGUF generator is converted once and kept; "
                                                      "unset = ~/.cache/softknn/generators")
    max_concurrent: int = Field(16, ge=1, description="generations running at once (decoded together, one batch a "
                                                      "step); more wait in the queue")
    max_queue: int = Field(32, ge=0, description="generations waiting for a slot; past it 429")
    max_tokens: int = Field(512, ge=1, description="largest max_tokens a request may ask for")
    threads: int = Field(1, ge=0, description="ONNX Runtime threads of the decode graph (0 = cores)")
    runtime: Literal["graph", "torch"] = Field("graph", description="graph: joint mixing and the plain model decode "
                                               "in ONNX Runtime with the memory in the KV cache and continuous "
                                               "batching; torch: every generation in torch with the memory hook (the "
                                               "reference; fixed α and exact requests always run there)")
    weights: Literal["auto", "fp32", "q4", "q4a8"] = Field("auto", description="decode graph weights: q4 = 4-bit "
                                                           "blocks (lossless for a GGUF Q4_1 model), q4a8 = the same "
                                                           "with int8 activations (llama.cpp's arithmetic), auto = "
                                                           "q4a8 where the blocks are lossless, else fp32")
    torch_concurrent: int = Field(2, ge=1, description="torch generations (fixed α, exact) running at once")
    cache_mb: float = Field(1024, gt=0, description="the decode graph's KV cache, MB (float32 keys and values of "
                            "the running generations' KB tokens, prompts and max_tokens): a generation waits until "
                            "what it may fill fits beside the running ones; one that can never fit gets 422")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SOFTKNN_", env_nested_delimiter="__", extra="ignore")

    bundle: Location | None = Field(None, description="bundle the service loads, as the KB named `default`: a "
                                    "directory, or a URI in object storage (s3://bucket/kb; fetched to "
                                    "SOFTKNN_CACHE_DIR, softknn.storage.remote)")
    bundles: dict[str, Location] = Field(default_factory=dict, description='named KBs the service loads besides, '
                                         'JSON: {"faq": "DIR", "regs": "s3://bucket/regs"} (`softknn serve --bundle '
                                         'faq=DIR`); requests pick one with `kb`')
    host: str = Field("127.0.0.1", description="interface the service binds")
    port: int = Field(8000, ge=0, le=65535, description="TCP port of the service")
    log_level: str = Field("info", description="debug | info | warning | error")
    cors_origins: list[str] = Field(default_factory=list, description="allowed CORS origins; empty = CORS off")
    use_gpu_index: bool = Field(True, description="put the FAISS index on the GPU when faiss-gpu sees one")
    shard_local_reads: bool = Field(True, description="`serve --ray`: a replica reads the retrieved chunks' memory "
                                    "rows of a shard on its own machine from the shard's files (the very files the "
                                    "shard verified and mapped) instead of through the shard actor")
    model: ModelSettings = Field(default_factory=ModelSettings)
    defaults: InferDefaults = Field(default_factory=InferDefaults)
    limits: Limits = Field(default_factory=Limits)
    batching: Batching = Field(default_factory=Batching)
    auth: Auth = Field(default_factory=Auth)
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    writes: Writes = Field(default_factory=Writes)

    @model_validator(mode="after")
    def _kb_names(self):
        for name in self.bundles:
            if not KB_NAME.fullmatch(name):
                raise ValueError(f"KB name {name!r}: use 1-64 letters, digits, '_', '.', '-' (a letter or digit first)")
        if self.bundle is not None and DEFAULT_KB in self.bundles:
            raise ValueError(f"bundle and bundles[{DEFAULT_KB!r}] both name the KB {DEFAULT_KB!r}: give one")
        known = self.kbs()
        for i, k in enumerate(self.auth.keys):
            unknown = [n for n in k.kbs if n != "*" and n not in known]
            if unknown:
                raise ValueError(f"auth.keys[{i}].kbs names {unknown}, not among the KBs served: {sorted(known)}")
        return self

    def kbs(self) -> dict[str, Location | None]:
        """The KBs served, by name: `bundles`, and `bundle` as the KB named `default` (also when it is
        unset and no `bundles` are given: one KB, waiting for POST /v1/admin/reload)."""
        out: dict[str, Location | None] = dict(self.bundles)
        if self.bundle is not None or not out:
            out = {DEFAULT_KB: self.bundle, **out}
        return out

    def device(self) -> str:
        if self.model.device != "auto":
            return self.model.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def encoder_options(settings: Settings, threads: int) -> dict:
    """Encoder keyword arguments for the model runtime (threads: what apply_threads set)."""
    m = settings.model
    return {"runtime": m.runtime, "precision": m.precision, "onnx_cache": m.onnx_cache, "threads": threads,
            "onnx_optimization": m.onnx_optimization}


SERVING_THREADS = 1  # model.threads = 0 in the service: per inference worker (docs/benchmarks.md, contention)


def apply_threads(settings: Settings, *, serving: bool = False) -> int:
    """Set torch's and faiss's intra-op threads from settings; returns the number set (ONNX Runtime
    gets it through encoder_options). model.threads = 0: SERVING_THREADS in the service (`serving`),
    the CPU cores elsewhere (build, query, eval: one process with the machine to itself)."""
    import os

    import faiss
    import torch

    n = settings.model.threads or (SERVING_THREADS if serving else os.cpu_count() or 1)
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)  # faiss has its own OpenMP pool; flat and IVF scans use it
    return n
