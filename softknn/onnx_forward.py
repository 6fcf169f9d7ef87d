"""The plain forward in ONNX Runtime (issue 16): exported once per model fingerprint and precision,
cached, and verified against torch on fixed inputs every time it is opened.

The graph maps the tokenizer's features to every layer's input `hidden_i` (B, T, C) (hidden_0 the
embeddings' output, hidden_n the last hidden state) and every layer's attention `query_i`, `key_i`,
`value_i` (B, nh, T, hs): what the fused pass resumes from (Encoder._resume) and what the builder
captures. Pooling, the fused memory layer and every layer after it stay in torch, so the contract
does not change. The exported module runs the layers one by one with the mask built in plain ops
(the form Encoder._resume uses), not transformers' mask helpers: tracing those with an unpadded
example bakes "no mask" into the graph, which is how a naive export came out wrong by up to 1.2.

fp32 must match torch within TOLERANCE on every output (padded positions included) or the
runtime refuses to open. int8 (dynamic quantisation of the verified fp32 graph) cannot, so it is
checked against a looser gate (pooled-embedding cosine ≥ INT8_MIN_COSINE) and is opt-in only.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
from pathlib import Path

import torch

from softknn.errors import ModelRuntimeError, UnsupportedModel

EXPORT_VERSION = 1  # bump when the graph's inputs/outputs or the export recipe change
TOLERANCE = 1e-4  # fp32: max |onnx − torch| over every output (issue 16)
INT8_MIN_COSINE = 0.95  # int8: min cosine of the pooled embeddings to torch's on VERIFY_TEXTS: a gate
# against a broken export, not a quality claim (measured: 0.979 worst with per-channel weights, 0.93
# per-tensor; quality cost on Banking77/ObliQA in docs/benchmarks.md)
OPSET = 18
PRECISIONS = ("fp32", "int8")
OPTIMIZATION = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
# Fixed verification inputs: one padded batch of different lengths (a short one, a long one, an
# unusual-script one) and a single unpadded text, so both mask cases are exercised.
VERIFY_TEXTS = [
    ["hi", "I lost my card yesterday and need a new one shipped to my home address as soon as possible.",
     "Zürich → Köln: 12,50 € 🚆 déjà-vu", "what is the exchange rate?"],
    ["Why was my top-up declined?"],
]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "softknn" / "onnx"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Layers(torch.nn.Module):
    """The module exported: embeddings, then each layer with its q/k/v captured (BERT family)."""

    def __init__(self, encoder):
        super().__init__()
        self.model = encoder.model
        self.attn = encoder._attn
        self.inputs = encoder.onnx_inputs

    def forward(self, *features):
        from softknn.encoder import _bind, _CaptureKV

        feats = dict(zip(self.inputs, features, strict=True))
        mask = feats["attention_mask"]  # (B, T)
        B, T = mask.shape
        hidden = self.model.embeddings(input_ids=feats["input_ids"], token_type_ids=feats.get("token_type_ids"))
        mask4d = mask.bool()[:, None, None, :].expand(B, 1, T, T)  # the sdpa form, as Encoder._resume
        hiddens, qkv = [hidden], []
        for i, layer in enumerate(self.model.encoder.layer):
            hook = _CaptureKV(self.attn[i])
            with _bind(hook):
                out = layer(hidden, attention_mask=mask4d)
            hidden = out[0] if isinstance(out, tuple) else out  # (B, T, C)
            hiddens.append(hidden)
            qkv += [hook.query, hook.key, hook.value]  # (B, nh, T, hs) each
        return (*hiddens, *qkv)


class OnnxForward:
    """The transformer of `encoder` in ONNX Runtime; `run(features)` -> (hidden_states, q, k, v).

    hidden_states[i] is layer i's input (B, T, C), hidden_states[-1] the last hidden state;
    q[i], k[i], v[i] (B, nh, T, hs) are layer i's attention projections.
    """

    def __init__(self, encoder, *, precision: str = "fp32", cache_dir: Path | None = None, threads: int = 1,
                 optimization: str = "all"):
        import onnxruntime as ort

        if precision not in PRECISIONS:
            raise ModelRuntimeError(f"model.precision must be one of {PRECISIONS}, got {precision!r}",
                                    field="model.precision")
        if encoder.device.type != "cpu":
            raise ModelRuntimeError(f"model.runtime=onnx runs on the CPU, but the model is on {encoder.device}; "
                                    "use model.runtime=torch on a GPU", field="model.runtime")
        if encoder.model_type not in _resumable() or not hasattr(encoder.model, "embeddings"):
            raise UnsupportedModel(f"{encoder.path}: model.runtime=onnx supports BERT-family models "
                                   f"({', '.join(sorted(_resumable()))}), not {encoder.model_type!r}")
        self.encoder = encoder
        self.precision = precision
        self.n = encoder.info.num_layers
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.path = self.cache_dir / f"{encoder.info.fingerprint[:32]}-v{EXPORT_VERSION}-{precision}.onnx"
        self.sidecar = self.path.with_suffix(".json")
        if not self.path.exists():
            self._export()
        self._check_sidecar()
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, threads)  # as torch: model.threads (0 = cores), set by the caller
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION[optimization])
        try:
            self.session = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise ModelRuntimeError(f"{self.path}: ONNX Runtime cannot load the cached export ({e}); "
                                    "delete it to export again", field="model.runtime") from e
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.verification = self._verify()

    # --- export -------------------------------------------------------------------------------
    def _export(self) -> None:
        """Export (fp32), quantise (int8), write atomically with a sidecar of checksums."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fp32 = self.path if self.precision == "fp32" else self.path.with_name(self.path.name.replace("-int8", "-fp32"))
        if not fp32.exists():
            tmp = fp32.with_name(f"{fp32.name}.tmp-{uuid.uuid4().hex[:8]}")
            try:
                self._export_fp32(tmp)
                os.replace(tmp, fp32)
            finally:
                tmp.unlink(missing_ok=True)
            self._write_sidecar(fp32, source=None)
        if self.precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            self._check_sidecar(fp32)
            tmp = self.path.with_name(f"{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
            try:
                # weights only (MatMul), per output channel: per-tensor scales cost 5x the cosine gap
                quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                                 op_types_to_quantize=["MatMul"])
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
            self._write_sidecar(self.path, source=fp32)

    def _export_fp32(self, out: Path) -> None:
        enc = self.encoder
        batch = enc.tokenize(VERIFY_TEXTS[0])  # padded: the traced graph must keep the mask
        args = tuple(batch.features[k] for k in enc.onnx_inputs)
        names = self.output_names()
        axes = {k: {0: "batch", 1: "tokens"} for k in enc.onnx_inputs}
        axes |= {k: ({0: "batch", 1: "tokens"} if k.startswith("hidden") else {0: "batch", 2: "tokens"}) for k in names}
        # The tracer warns at Python-bool shape checks (sdpa's `q_length > 1 and attention_mask is None`):
        # with the mask always passed they are constant, and _verify checks the graph at other shapes.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(_Layers(enc).eval(), args, str(out), input_names=list(enc.onnx_inputs),
                              output_names=names, dynamic_axes=axes, opset_version=OPSET, dynamo=False)

    def output_names(self) -> list[str]:
        return ([f"hidden_{i}" for i in range(self.n + 1)]
                + [f"{w}_{i}" for i in range(self.n) for w in ("query", "key", "value")])

    def _write_sidecar(self, path: Path, *, source: Path | None) -> None:
        meta = {"export_version": EXPORT_VERSION, "fingerprint": self.encoder.info.fingerprint,
                "precision": "int8" if source else "fp32", "sha256": _sha256(path), "bytes": path.stat().st_size,
                "opset": OPSET, "torch": torch.__version__, "source_sha256": _sha256(source) if source else None}
        side = path.with_suffix(".json")
        tmp = side.with_name(f"{side.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, side)

    def _check_sidecar(self, path: Path | None = None) -> None:
        """The cached file is the one this code exported for these weights (checksum, fingerprint)."""
        path = path or self.path
        side = path.with_suffix(".json")
        try:
            meta = json.loads(side.read_text())
        except (OSError, ValueError) as e:
            raise ModelRuntimeError(f"{side}: the export's record is missing or unreadable ({e}); "
                                    f"delete {path.name} to export again", field="model.runtime") from e
        if meta.get("fingerprint") != self.encoder.info.fingerprint or meta.get("export_version") != EXPORT_VERSION:
            raise ModelRuntimeError(f"{path}: exported for other weights or another export version; "
                                    "delete it to export again", field="model.runtime")
        if meta.get("sha256") != _sha256(path):
            raise ModelRuntimeError(f"{path}: the cached export was modified after it was written (sha256 "
                                    "differs from its record); delete it to export again", field="model.runtime")

    # --- run and verify -----------------------------------------------------------------------
    def run(self, features: dict[str, torch.Tensor], names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The named outputs (default all) for a tokenized batch, as CPU torch tensors."""
        feeds = {k: features[k].numpy() for k in self.encoder.onnx_inputs}
        names = names or self.outputs
        return dict(zip(names, (torch.from_numpy(a) for a in self.session.run(names, feeds)), strict=True))

    def _verify(self) -> dict:
        """Every output against torch on VERIFY_TEXTS; refuse to open on a mismatch (see module doc)."""
        enc = self.encoder
        worst, worst_name, cos = 0.0, "", 1.0
        for texts in VERIFY_TEXTS:
            batch = enc.tokenize(texts)
            ref = enc.torch_layers(batch)
            got = self.run(batch.features)
            for name in self.outputs:
                d = float((got[name] - ref[name]).abs().max())
                if d > worst:
                    worst, worst_name = d, name
            last = f"hidden_{self.n}"
            e_ref, e_got = enc._pool(batch, ref[last]), enc._pool(batch, got[last])  # (B, D) normalised
            cos = min(cos, float((e_ref * e_got).sum(-1).min()))
        report = {"precision": self.precision, "max_abs_diff": worst, "worst_output": worst_name,
                  "min_embedding_cosine": cos}
        if self.precision == "fp32" and not worst <= TOLERANCE:
            raise ModelRuntimeError(f"{self.path}: the ONNX export differs from torch by {worst:.3g} at "
                                    f"{worst_name} (> {TOLERANCE}) on the fixed verification inputs; refusing "
                                    "to serve a different answer. Delete it to export again, or use "
                                    "model.runtime=torch", field="model.runtime")
        if self.precision == "int8" and not cos >= INT8_MIN_COSINE:
            raise ModelRuntimeError(f"{self.path}: the int8 export's embeddings reach cosine {cos:.4f} to "
                                    f"torch's (< {INT8_MIN_COSINE}) on the fixed verification inputs; delete "
                                    "it to export again, or use model.precision=fp32", field="model.runtime")
        return report


def _resumable() -> set[str]:
    from softknn.encoder import _RESUMABLE

    return _RESUMABLE
