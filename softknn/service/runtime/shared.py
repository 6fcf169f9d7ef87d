"""What every KB of one app shares (`Shared`: the batcher, the generation slots and threads, the
KB-write thread, the loaded generators), and the batcher's runner over the core (`run_engine`,
`plain_embeddings`), with the admission tokenizer (`token_counter`)."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from softknn.generate.model import Generator
from softknn.infer.engine import GROUP_SIZE, Engine, InferParams
from softknn.infer.results import InferResult
from softknn.model.encoder import Encoder
from softknn.params import Settings
from softknn.service.batching import Batcher
from softknn.service.metrics import Metrics
from softknn.service.runtime.generation import GenSlots

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class PlainEmbed:
    """A text's parameters when only the plain model's embedding is asked for (/v1/embeddings,
    /v1/rerank): no retrieval, no fused pass. `truncate`: cut at the model's token limit."""

    truncate: bool = False


def plain_embeddings(engine: Engine, texts: list[str], params: list[PlainEmbed],
                     group_size: int = GROUP_SIZE) -> list[np.ndarray]:
    """The plain model's embedding (D,) float32 of each text: the encoder's own pipeline (pooling,
    normalisation), in length-sorted passes of at most `group_size` texts as Engine.infer runs."""
    enc = engine.encoder
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    size = group_size if group_size > 0 else len(texts)
    out: list[np.ndarray] = [np.empty(0, np.float32)] * len(texts)
    for g in range(0, len(order), size):
        idx = order[g : g + size]
        batch = enc.tokenize([texts[i] for i in idx], truncate=[params[i].truncate for i in idx], positions=idx)
        emb = enc.forward_plain(batch).embedding.float().cpu().numpy()
        for j, i in enumerate(idx):
            out[i] = emb[j]
    return out


def run_engine(engine: Engine, texts: list[str], params: list[InferParams | PlainEmbed],
               group_size: int = GROUP_SIZE) -> list[InferResult | np.ndarray]:
    """The batcher's runner: one micro-batch through the core, as `softknn query` would run it
    (in length-sorted passes of at most `group_size` texts: Engine.infer); the texts that ask for
    the plain embedding only (PlainEmbed) through the plain pass alone."""
    plain: list[int] = []
    plain_params: list[PlainEmbed] = []
    rest: list[int] = []
    rest_params: list[InferParams] = []
    for i, p in enumerate(params):
        if isinstance(p, PlainEmbed):
            plain.append(i)
            plain_params.append(p)
        else:
            rest.append(i)
            rest_params.append(p)
    if not plain:
        return list(engine.infer(texts, rest_params, group_size=group_size))
    out: list[InferResult | np.ndarray] = [None] * len(texts)  # type: ignore[list-item]  # every slot set below
    for i, e in zip(plain, plain_embeddings(engine, [texts[i] for i in plain], plain_params, group_size)):
        out[i] = e
    if rest:
        for i, r in zip(rest, engine.infer([texts[i] for i in rest], rest_params, group_size=group_size)):
            out[i] = r
    return out


def token_counter(encoder: Encoder) -> Tokenizer:
    """A private copy of the model's fast (`tokenizers.Tokenizer`) tokenizer, truncation and padding off.

    A private copy because the transformers wrapper reconfigures its Rust tokenizer on every call
    (truncation, padding) and concurrent reconfiguration fails ("Already borrowed"); this copy is
    configured once and only read, from any number of admission threads.
    """
    backend = encoder.tokenizer.backend_tokenizer
    tok = type(backend).from_str(backend.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok


def _lower_priority() -> None:
    """Nice the calling thread (Linux sets niceness per thread) by WRITE_NICENESS; never raises."""
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITE_NICENESS)
    except (OSError, AttributeError):  # not permitted, or not Linux: writes run at normal priority
        pass


WRITE_NICENESS = 10


class Shared:
    """What every KB of one app shares: the batcher (every forward pass of the process), the
    generation slots and threads, the KB-write thread, the loaded generators."""

    def __init__(self, settings: Settings, metrics: Metrics, generator: Generator | None = None):
        b = settings.batching
        self.batcher = Batcher(max_batch_size=b.max_batch_size, max_batch_tokens=b.max_batch_tokens,
                               max_wait_ms=b.max_wait_ms, queue_size=b.queue_size,
                               runner=functools.partial(run_engine, group_size=b.group_size),
                               slot_unit=settings.defaults.k, metrics=metrics, workers=b.workers)
        self.generators: dict[str, Generator] = {}
        if generator is not None:
            self.generators[generator.info.name] = generator  # shared, like `encoder` (tests, several apps)
        g = settings.generator
        self.gen_slots = GenSlots(g.max_concurrent, g.max_queue, metrics)
        self.gen_pool = ThreadPoolExecutor(g.max_concurrent, thread_name_prefix="softknn-gen")
        # KB writes (encode, new version, compaction) run on one thread of lower CPU priority, so on a
        # busy machine the inference workers get the cores first (bench/writes.py measures both)
        self.write_pool = ThreadPoolExecutor(1, thread_name_prefix="softknn-write", initializer=_lower_priority)
