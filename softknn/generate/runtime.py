"""The decode graph (softknn.generate.graph) opened in ONNX Runtime: one session per weight format
and memory-layer set, built once from the model in memory.

`DecoderSession.run` takes the caller's cache arrays as they are (no copy: each is bound as an
OrtValue over the numpy buffer) and returns the graph's outputs as numpy arrays.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from softknn.errors import ModelRuntimeError
from softknn.generate.graph import WEIGHTS, DecoderShape, build_decoder, decoder_shape


@dataclass(frozen=True)
class DecoderKey:
    weights: str
    memory_layers: tuple[int, ...]


class DecoderSession:
    """An ORT session of the decode graph for one (weights, memory layers)."""

    def __init__(self, model, weights: str, memory_layers: list[int], *, threads: int = 1):
        import onnxruntime as ort

        if weights not in WEIGHTS:
            raise ValueError(f"generator weights must be one of {WEIGHTS}, not {weights!r}")
        t0 = time.perf_counter()
        self.shape: DecoderShape = decoder_shape(model.config)
        self.weights = weights
        self.memory_layers = sorted(set(memory_layers))
        proto = build_decoder(model, weights, self.memory_layers)
        data = proto.SerializeToString()
        del proto
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(threads, 0)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # the lenient shape merges of the dynamic dims are expected
        try:
            self.session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - any ORT failure to open is the runtime's failure
            raise ModelRuntimeError(f"decode graph ({weights}) did not open in ONNX Runtime: {e}") from e
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.has_plain_bias = "bias_plain" in self.input_names
        self.load_s = time.perf_counter() - t0
        self._lock = threading.Lock()  # one run at a time: the caller's cache buffers are shared

    def run(self, input_ids: np.ndarray, position_ids: np.ndarray, bias: np.ndarray, bias_plain: np.ndarray | None,
            keys: list[np.ndarray], values: list[np.ndarray]) -> dict[str, np.ndarray]:
        """input_ids, position_ids (B, T) int64; bias[_plain] (B, 1, g·T, C + T) float32; keys[ℓ]
        (B, nkv, hs, C), values[ℓ] (B, nkv, C, hs) float32, C-contiguous. Returns the outputs by name:
        logits (B, V), key_ℓ / value_ℓ (B, nkv, T, hs), attn (B, C + T) where the graph has memory."""
        import onnxruntime as ort

        feed = {"input_ids": input_ids, "position_ids": position_ids, "bias": bias}
        if self.has_plain_bias:
            feed["bias_plain"] = bias if bias_plain is None else bias_plain
        binding = self.session.io_binding()
        for name, arr in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr)))
        for li in range(self.shape.layers):
            binding.bind_ortvalue_input(f"past_key_{li}", ort.OrtValue.ortvalue_from_numpy(keys[li]))
            binding.bind_ortvalue_input(f"past_value_{li}", ort.OrtValue.ortvalue_from_numpy(values[li]))
        for name in self.output_names:
            binding.bind_output(name)
        with self._lock:
            self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu(), strict=True))
