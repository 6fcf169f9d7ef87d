"""The one place that picks the encoder's runtime: what opens the model every entry point serves.

As in text-embeddings-inference (`backends/src/lib.rs`), one place picks the implementation behind
the model seam (softknn.model.backends.ModelForward): the commands (`encoder_for`) and the service
(`open_encoder`, with the serving threads) open their Encoder here, from the Settings, and nowhere
else. The runtime of the plain pass (`model.runtime`: torch, onnx, or auto) is chosen inside
`Encoder.__init__` (softknn.model.encoder: onnx through softknn.model.onnx_forward where it opens
and verifies), which is what this module calls.
"""

from __future__ import annotations

import os

import faiss
import torch

from softknn.model.encoder import Encoder
from softknn.params import Settings

SERVING_THREADS = 1  # model.threads = 0 in the service: per inference worker (docs/benchmarks.md, contention)


def device_of(settings: Settings) -> str:
    """model.device, with auto resolved: cuda when torch sees one, else cpu."""
    if settings.model.device != "auto":
        return settings.model.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def encoder_options(settings: Settings, threads: int) -> dict:
    """Encoder keyword arguments for the model runtime (threads: what apply_threads set)."""
    m = settings.model
    return {"runtime": m.runtime, "precision": m.precision, "onnx_cache": m.onnx_cache, "threads": threads,
            "onnx_optimization": m.onnx_optimization}


def apply_threads(settings: Settings, *, serving: bool = False) -> int:
    """Set torch's and faiss's intra-op threads from settings; returns the number set (ONNX Runtime
    gets it through encoder_options). model.threads = 0: SERVING_THREADS in the service (`serving`),
    the CPU cores elsewhere (build, query, eval: one process with the machine to itself)."""
    n = settings.model.threads or (SERVING_THREADS if serving else os.cpu_count() or 1)
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)  # faiss has its own OpenMP pool; flat and IVF scans use it
    return n


def open_encoder(settings: Settings, threads: int) -> Encoder:
    """The Encoder `settings` ask for (model, device, runtime, precision, ONNX cache and
    optimisation), its intra-op threads `threads` (what apply_threads set)."""
    return Encoder(settings.model.name, device=device_of(settings), **encoder_options(settings, threads))


def encoder_for(settings: Settings) -> Encoder:
    """A command's Encoder: torch's and faiss's threads set from `settings` (apply_threads: the CPU
    cores unless model.threads says otherwise), then open_encoder."""
    return open_encoder(settings, apply_threads(settings))
