"""The seams the engine runs on, each a Protocol with its implementations chosen in one place.

A new kind of model, index or memory implements the Protocol and is added where the choice is
made; nothing that calls it changes:

- ModelForward: the model the Engine runs (tokenize, the plain pass, the fused pass, and what a
  memory store asks of it). softknn.model.encoder.Encoder; opened from the settings in one place,
  softknn.model.runtime. Its plain pass is a PlainForward: torch (Encoder._plain_torch) or
  ONNX Runtime (softknn.model.onnx_forward.OnnxForward.plain), picked by the Encoder's `runtime` in
  Encoder.forward_plain. A causal language model (softknn.generate.model.Generator) is a second kind
  of model beside it, run by softknn.generate.engine, not through this Protocol.
- ChunkSearch: dense search over the KB's chunk embeddings (top k, exact similarities, dot
  products of given rows). softknn.retrieval.chunk_index.ChunkIndex (flat, HNSW, IVF, IVF-PQ: the kind
  is chosen at build time by softknn.retrieval.chunk_index.choose_index and read back from the manifest), or a
  sharded bundle's merge over its shards (softknn.storage.shards); softknn.storage.bundle.load_bundle picks one.
- ShardBackend: where a sharded bundle's shards run (softknn.storage.shards.Shard in every case): in
  this process (softknn.storage.shards.LocalShards) or as Ray actors (softknn.storage.ray_shards.RayShards);
  load_bundle's `shard_backend` factory picks one (None: in this process).
- MemoryStore: the memory layer's keys/values of retrieved chunks, padded into a MemoryBatch.
  softknn.storage.memory_stores.KVStore (stored K/V), softknn.storage.memory_stores.HiddenStore (hidden states, fp16 or
  int8, projected on read), softknn.storage.memory_stores.RecomputeStore (recomputed from the chunk text),
  or a sharded bundle's fan-out (softknn.storage.shards); softknn.storage.memory_stores.load_memory picks one from
  the manifest's `memory`, softknn.storage.shards.load_sharded builds the sharded one.

The retrieval that needs only these (no model) is softknn.retrieval.search.Retriever.

Beside the Protocols, the types that cross the model seam: TokenBatch (a tokenized batch) and
PlainPass (what a plain pass returns) in their shapes, ModelInfo, FuseFn (the memory layer's
replacement attention), RESUMABLE_TYPES, and IndexSpec (the index kind a ChunkSearch was built as).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

if TYPE_CHECKING:
    from softknn.model.attention import MemoryBatch

# fuse(query, key, value, scaling) -> out, all (B, nh, T, hs): the memory layer's replacement.
FuseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

# Architectures whose layers can be called as layer(hidden, attention_mask=...) to resume a pass
# from layer L's input; others re-run the whole model with the hook bound (same result, slower).
# The ONNX runtime exports these layer by layer, so it serves these alone.
RESUMABLE_TYPES = {"bert", "roberta", "xlm-roberta", "electra", "camembert"}


@dataclass
class TokenBatch:
    """A padded batch with, per token, its character span in the original text."""

    texts: list[str]
    features: dict[str, torch.Tensor]  # model inputs: input_ids, attention_mask, ... (B, T)
    special: torch.Tensor  # (B, T) bool, True for [CLS]/[SEP]-like tokens
    offsets: torch.Tensor  # (B, T, 2) char span [start, end) of each token in its text
    n_tokens: list[int]  # non-pad tokens per input
    truncated: list[bool]

    @property
    def mask(self) -> torch.Tensor:
        return self.features["attention_mask"].bool()  # (B, T)


@dataclass
class PlainPass:
    embedding: torch.Tensor  # (B, D) pooled, normalised
    token_embeddings: torch.Tensor  # (B, T, C) last hidden state
    hidden_states: tuple[torch.Tensor, ...] | None = None  # hidden_states[L] = layer L's input
    key: torch.Tensor | None = None  # (B, nh, T, hs) at the capture layer
    value: torch.Tensor | None = None
    query: torch.Tensor | None = None
    capture_layer: int | None = None


@dataclass
class ModelInfo:
    name: str
    path: str
    fingerprint: str
    num_layers: int
    num_heads: int
    head_dim: int
    dim: int
    max_seq_length: int
    extra: dict = field(default_factory=dict)
    runtime: str = "torch"  # what runs the plain forward: torch | onnx
    precision: str = "fp32"  # its numerics: fp32 | int8 (onnx only); a bundle's K/V must share them
    requested: str = "torch"  # what was asked for: torch | onnx | auto (onnx where it opens and verifies)
    fallback: str | None = None  # auto that runs torch: why onnx did not open


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index and its parameters; stored in the manifest, so a bundle rebuilds from it
    (softknn.retrieval.chunk_index builds and opens it: the ChunkSearch's `spec`)."""

    kind: str  # flat | hnsw | ivf | ivfpq (never auto once chosen)
    params: dict
    reason: str = ""


class PlainForward(Protocol):
    """The unmodified model over a tokenized batch: the pooled embedding, the last hidden state,
    every layer's input (keep_hidden) and the q/k/v of `capture_layer`, in PlainPass's shapes."""

    def __call__(self, batch: TokenBatch, capture_layer: int | None, keep_hidden: bool) -> PlainPass: ...


@runtime_checkable
class ModelForward(Protocol):
    """The model as the Engine runs it, and as a MemoryStore computes keys/values with it."""

    info: ModelInfo  # name, fingerprint, shape, runtime and precision
    device: torch.device

    def check_layer(self, layer: int) -> int:
        """The layer index normalised (negative counts from the end); InvalidInput out of range."""
        ...

    def tokenize(self, texts: list[str], *, truncate: bool | list[bool] = True, max_tokens: int | None = None,
                 positions: list[int] | None = None) -> TokenBatch:
        """A padded batch, each token with its character span; an over-long input cut or refused."""
        ...

    def forward_plain(self, batch: TokenBatch, *, capture_layer: int | None = None,
                      keep_hidden: bool = False) -> PlainPass:
        """The plain pass (PlainForward), through whichever runtime the model was opened with."""
        ...

    def forward_fused(self, batch: TokenBatch, layer: int, fuse: FuseFn, plain: PlainPass | None = None, *,
                      resume: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(embedding (B, D), tokens (B, T, C)) with layer `layer`'s attention replaced by `fuse`."""
        ...

    def project_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) of layer `layer` from its input hidden states (n, C)."""
        ...

    def capture_kv(self, batch: TokenBatch, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """key, value (B, nh, T, hs) at layer `layer`, running the layers up to it only."""
        ...


@runtime_checkable
class ChunkSearch(Protocol):
    """Dense search over the KB's chunk embeddings e_c (unit norm); ids are chunk rows."""

    spec: IndexSpec  # the index kind and parameters the bundle was built with
    ntotal: int  # number of chunks

    def search(self, xq: np.ndarray, k: int, *, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) (B, k): the top k by e_q·e_c (score desc, id asc), −1 ids past the KB's end;
        `exact`: brute force, whatever the index kind."""
        ...

    def search_among(self, xq: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) (B, min(k, |rows|)): the top k among the chunks `rows` (ascending ids) only, by the
        index restricted to them (exact for flat, the index's approximation otherwise)."""
        ...

    def similarities(self, xq: np.ndarray) -> torch.Tensor:
        """(B, N) float32 e_q·e_c over every chunk (the exact path's scores)."""
        ...

    def rows_dot(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        """e_q·e_c of the given rows, for one query q (D,)."""
        ...


@runtime_checkable
class ShardBackend(Protocol):
    """The shards of a sharded bundle, wherever they run: a softknn.storage.shards.Shard method per shard."""

    def call(self, method: str, args: list[tuple]) -> list:
        """`method(*args[s])` on every shard s, results in shard order."""
        ...

    def call_some(self, method: str, shards: list[int], args: list[tuple]) -> list:
        """`method(*args[j])` on shard shards[j] only, results in that order."""
        ...

    def health(self) -> list[str]:
        """Why a shard cannot answer now, one line per such shard naming it; [] when all answer."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class MemoryStore(Protocol):
    """The memory layer's keys/values of the KB's chunks, whatever the stored representation."""

    start: np.ndarray  # (N,) each chunk's first token row (into the bundle's token_spans)
    count: np.ndarray  # (N,) each chunk's number of memory tokens

    def attach(self, encoder: ModelForward, layer: int) -> None:
        """Give the store the model and layer it computes keys/values with (stored K/V: none)."""
        ...

    def gather(self, ids: list[list[int]], weights: list[list[float]], device: torch.device) -> MemoryBatch:
        """The padded memory of R per input: key/value (B, nh, S, Lm, hs), token mask, w_db (B, S)."""
        ...
