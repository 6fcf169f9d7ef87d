"""The one place that picks the encoder's runtime: what opens the model every entry point serves.

As in text-embeddings-inference (`backends/src/lib.rs`), one place picks the implementation behind
the model seam (softknn.model.backends.ModelForward): the commands (`encoder_for`) and the service
(`open_encoder`, with the serving threads) open their Encoder here, from the Settings, and nowhere
else. The runtime of the plain pass (`model.runtime`: torch, onnx, or auto) is chosen inside
`Encoder.__init__` (softknn.model.encoder: onnx through softknn.model.onnx_forward where it opens
and verifies), which is what this module calls.
"""

from __future__ import annotations

from softknn.model.encoder import Encoder
from softknn.params import Settings, apply_threads, encoder_options


def open_encoder(settings: Settings, threads: int) -> Encoder:
    """The Encoder `settings` ask for (model, device, runtime, precision, ONNX cache and
    optimisation), its intra-op threads `threads` (what apply_threads set)."""
    return Encoder(settings.model.name, device=settings.device(), **encoder_options(settings, threads))


def encoder_for(settings: Settings) -> Encoder:
    """A command's Encoder: torch's and faiss's threads set from `settings` (apply_threads: the CPU
    cores unless model.threads says otherwise), then open_encoder."""
    return open_encoder(settings, apply_threads(settings))
