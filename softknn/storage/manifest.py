"""A bundle's manifest, typed: what the core reads of `manifest.json`.

The builder writes the manifest as a plain dict (index_builder, softknn.storage.bundle.finalize) and its
content address is the sha256 of that dict (`softknn.storage.layout.version_id`), so the dict stays the
record on disk. Every reader goes through `Manifest`: parsed and checked once when a bundle is
opened (a malformed manifest is a BundleError naming the field, never a KeyError later), read by
attribute after. Unknown fields are kept (a newer builder's additions survive a round trip) and
`raw` is the dict as read, for what is hashed or shown whole (/v1/index, `softknn info`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from softknn.common.errors import BundleError


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ModelRecord(_Section):
    """The model that built the bundle; its queries must come from the same weights and numerics."""

    name: str | None = None
    fingerprint: str
    dim: int
    num_heads: int
    head_dim: int
    num_layers: int
    max_seq_length: int | None = None
    runtime: str = "torch"  # older bundles carry neither: torch fp32 built them
    precision: str = "fp32"


class IndexRecord(_Section):
    kind: str
    params: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""


class Counts(_Section):
    chunks: int
    tokens: int
    docs: int | None = None
    labelled_chunks: int | None = None


class FileRecord(_Section):
    sha256: str
    bytes: int


class LexicalRecord(_Section):
    settings: dict[str, Any]  # softknn.retrieval.lexical.LexicalSpec.to_manifest()
    vocabulary: int | None = None
    postings: int | None = None


class ShardRecord(_Section):
    dir: str
    rows: tuple[int, int]  # [start, end) of the shard's rows in the whole KB
    version_id: str


class Calibration(_Section):
    """What `softknn calibrate` / the build's leave-one-out set (softknn.retrieval.calibration); the rest
    of the section (grids, validation figures) is kept as extra fields."""

    abstain_threshold: float | None = None  # the score-only rule's t
    abstain_threshold_gated: float | None = None  # the gated rule's t (with min_similarity)
    min_similarity: float | None = None  # the gated rule's s_min
    retrieval_defaults: dict[str, dict[str, float]] = Field(default_factory=dict)  # mode -> {temperature, lexical_weight}


class GeneratorRecord(_Section):
    """The causal LM whose keys/values the bundle stores (softknn.generate.memory), and how."""

    name: str
    fingerprint: str
    family: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layers: list[int]  # the memory layers, 0-based
    memory: str  # fp32 | fp16 | int8 | q4 | q2 | recompute (softknn.generate.memory)
    prefix: list[int] = Field(default_factory=list)  # the tokens each chunk was encoded after
    tokens: int = 0
    bytes_per_chunk: float = 0.0
    bytes_per_token: float = 0.0  # stored bytes / chunk tokens (measured on the files)
    bytes_per_token_formula: float = 0.0  # softknn.generate.memory.bytes_per_token: what the layout should take
    keep: float = 1.0  # fraction of each chunk's tokens stored (SnapKV-style selection); 1 = all
    seconds: float | None = None  # the builder's generator pass (the calibration's own is in its record)
    calibration: dict | None = None  # k and β chosen from the KB's own pseudo-questions (softknn.generate.calibration)


class Manifest(_Section):
    format_version: int
    version_id: str
    created_at: str | None = None
    model: ModelRecord
    memory_layer: int
    index: IndexRecord
    kv_dtype: str = "float32"
    memory: str = "kv"  # older bundles carry no memory field: stored K/V
    counts: Counts
    files: dict[str, FileRecord]
    labels: list[str] = Field(default_factory=list)
    calibration: Calibration = Field(default_factory=Calibration)
    lexical: LexicalRecord | None = None
    shards: list[ShardRecord] | None = None
    generator: GeneratorRecord | None = None
    _raw: dict = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, raw: dict, where: Path | str) -> Manifest:
        """The typed view of a manifest dict; BundleError naming the first bad field."""
        try:
            m = cls.model_validate({**raw, "calibration": raw.get("calibration") or {}})
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise BundleError(f"{where}: malformed manifest: {field}: {err['msg']}") from None
        m._raw = raw
        return m

    @property
    def raw(self) -> dict:
        """The manifest as read (what version_id hashes)."""
        return self._raw

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    def replaced(self, **sections) -> Manifest:
        """This manifest with whole top-level sections replaced (benchmarks derive bundles in memory)."""
        return Manifest.of({**self.raw, **sections}, "a derived manifest")
