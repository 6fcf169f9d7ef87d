"""The one Settings object: built once at each entry point (CLI, service) and passed down.

Every field is also an environment variable: prefix `SOFTKNN_`, nested sections joined by `__`
(e.g. `SOFTKNN_DEFAULTS__ALPHA=0.5`, `SOFTKNN_AUTH__API_KEY=...`). docs/usage.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, create_model, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from softknn.common.kb_names import DEFAULT_KB, KB_NAME  # noqa: F401 (re-exported)
from softknn.common.location import Location
from softknn.common.table import GenParams, InferParams, entries, fill


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


# --- the request parameters' settings: derived from the parameter table ------------------------------
class Section(BaseModel):
    """A settings section made from a parameter dataclass of softknn.common.table (`section`): one field
    per parameter the table marks a setting, with its default, bounds and description; a request or
    an option that leaves the parameter unset gets the value set here (softknn.common.table.fill)."""

    if TYPE_CHECKING:  # the fields are the table's, made at import: the checker sees them as Any
        def __getattr__(self, name: str) -> Any: ...


def section(cls: type, title: str, doc: str) -> type[Section]:
    """The settings section of parameter dataclass `cls`: its settings parameters, by public name
    (a deprecated name still read from the environment, e.g. SOFTKNN_DEFAULTS__TEMPERATURE)."""
    fields: dict[str, Any] = {}
    for e in entries(cls):
        if e.param.setting:
            alias = AliasChoices(e.name, *e.param.aliases) if e.param.aliases else None
            fields[e.name] = (e.type | None if e.optional else e.type,
                              Field(e.default, description=e.param.description, validation_alias=alias,
                                    **e.param.bounds()))  # type: ignore[call-overload]
    return create_model(title, __base__=Section, __doc__=doc, **fields)


if TYPE_CHECKING:
    InferDefaults = Section
    GenDefaults = Section
else:
    InferDefaults = section(InferParams, "InferDefaults", "The settings section `defaults` (SOFTKNN_DEFAULTS__*): "
                            "what an inference request (/v1/infer, /v1/embeddings, /v1/rerank, softknn query) leaves "
                            "unset.")
    GenDefaults = section(GenParams, "GenDefaults", "The settings section `generate` (SOFTKNN_GENERATE__*): what a "
                          "generation request (/v1/generate, /v1/chat/completions, softknn generate) leaves unset.")


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
    weights: Literal["auto", "fp32", "q4", "q4a8", "w8a8"] = Field("auto", description="decode graph weights: q4 = 4-bit "
                                                           "blocks (lossless for a GGUF Q4_1 model), q4a8 = the same "
                                                           "with int8 activations (llama.cpp's arithmetic), w8a8 = "
                                                           "int8 weights per channel and activations per token "
                                                           "(ONNX Runtime's int8 GEMM: batched steps cost little more "
                                                           "than one row), auto = w8a8 where the model is 4-bit "
                                                           "blocks, else fp32")
    torch_concurrent: int = Field(2, ge=1, description="torch generations (fixed α, exact) running at once")
    cache_mb: float = Field(1024, gt=0, description="the decode graph's KV cache, MB (keys and values of the "
                            "running generations' KB tokens, prompts and max_tokens): a generation waits until "
                            "what it may fill fits beside the running ones; one that can never fit gets 422")
    kv_cache: Literal["fp32", "int8"] = Field("int8", description="the decode graph's KV cache: int8 = keys and "
                                              "values rounded to 8 bits with a fixed scale per layer and channel "
                                              "(a quarter of fp32's bytes to read each step), fp32 = as computed")
    attention: Literal["auto", "kernel", "graph"] = Field("auto", description="the decode graph's attention over "
                                                          "an int8 cache: kernel = a C kernel compiled at first "
                                                          "use with the machine's C compiler (cc), the graph run "
                                                          "in segments around it (a 16-row step's attention in "
                                                          "a quarter of the time); graph = ONNX Runtime's "
                                                          "GroupQueryAttention; auto = kernel where it compiles, "
                                                          "else graph")
    attention_threads: int = Field(0, ge=0, description="threads the C kernel shares a step's attention among "
                                   "(its rows' kv heads and prefill tokens; a call too small to be worth waking "
                                   "a thread runs alone), whatever the decode graph's threads: 0 = cores")
    lanes: int = Field(0, ge=0, description="with the kernel: threads a decode step of 2 rows or more is cut "
                       "among, each running its share of the rows through the graph's segments and the "
                       "kernel, while no retrieval or generation in torch takes a core beside it (one "
                       "row's step is not cut; it runs on the decode thread with generator.threads): "
                       "0 = cores, 1 = none")


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
    generate: GenDefaults = Field(default_factory=GenDefaults)
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


def settings_from(**overrides: Any) -> Settings:
    """A command's Settings: from the environment, then the options given (`section__name=value`; None = unset)."""
    s = Settings()
    for key, value in overrides.items():
        if value is not None:
            section_name, _, name = key.partition("__")
            if name:
                setattr(getattr(s, section_name), name, value)
            else:
                setattr(s, section_name, value)
    return s


# --- the one step from what a request or a command gives to the core's parameters --------------------
def limit(settings: Settings, path: str) -> int:
    """The value of setting `path` ("limits.max_k", a Param's `limit`)."""
    section, _, name = path.partition(".")
    return getattr(getattr(settings, section), name)


def _capped(p: Any, settings: Settings) -> Any:
    """`p` with a declared default above this server's limit lowered to it (e.g. evidence 5 where
    limits.max_evidence is 2); a value given or set explicitly is checked against the limit instead
    (the request schemas; check_limits at start)."""
    cls: Any = type(p)  # a parameter dataclass of softknn.common.table
    src = dict(p.sources)
    low = {e.attr: cap for e in entries(cls) if e.param.limit and src.get(e.name) == "default"
           and getattr(p, e.attr) is not None and getattr(p, e.attr) > (cap := limit(settings, e.param.limit))}
    return replace(p, **low) if low else p


def infer_params(settings: Settings, given: Mapping[str, Any]) -> InferParams:
    """An inference's parameters: each from `given` (a request's fields, a command's options; None =
    unset), else from what the settings section `defaults` sets, else the table's default (at most
    the server's limit); the bundle fills what is still unset (InferParams.resolved). `sources` names
    where each value came from."""
    out: InferParams = _capped(fill(InferParams, given, settings.defaults), settings)
    return out


def gen_params(settings: Settings, given: Mapping[str, Any]) -> GenParams:
    """A generation's parameters, as infer_params from the section `generate`; the bundle fills k and
    β (GenEngine.resolve)."""
    out: GenParams = _capped(fill(GenParams, given, settings.generate), settings)
    return out


def check_limits(settings: Settings) -> None:
    """Refuse a setting above the limit its parameter has (defaults.k > limits.max_k, ...): a request
    that leaves the parameter unset would get it. ValueError naming both."""
    for section, cls in (("defaults", InferParams), ("generate", GenParams)):
        values = getattr(settings, section)
        for e in entries(cls):
            if e.param.limit and e.name in values.model_fields_set and getattr(values, e.name) is not None:
                if getattr(values, e.name) > (cap := limit(settings, e.param.limit)):
                    raise ValueError(f"{section}.{e.name} = {getattr(values, e.name)} exceeds {e.param.limit} = {cap}")
