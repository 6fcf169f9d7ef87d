"""The plain forward in ONNX Runtime: exported once per model fingerprint and precision,
cached, and verified against torch on fixed inputs every time it is opened.

The graph maps the tokenizer's features to every layer's input `hidden_i` (B, T, C) (hidden_0 the
embeddings' output, hidden_n the last hidden state) and every layer's attention `query_i`, `key_i`,
`value_i` (B, nh, T, hs): what the fused pass resumes from (Encoder._resume) and what the builder
captures. Pooling, the fused memory layer and every layer after it stay in torch, so the contract
does not change. The exported module runs the layers one by one with the mask built in plain ops
(the form Encoder._resume uses), not transformers' mask helpers: tracing those with an unpadded
example bakes "no mask" into the graph, which is how a naive export came out wrong by up to 1.2.

The graph runs *packed* batches (export v2): `Packing` puts the batch's sequences, without their
padding, side by side into rows (first fit, longest first), each token with the position id torch
gives it in the padded batch and a segment id; attention is block-diagonal by segment. The GEMMs,
~85% of the time, then run on real tokens only (Banking77 batches of 8 are a third padding), while
a wider row costs more attention: the row width is the one of least estimated cost (PACK_*), so a
batch of equal lengths (the builder's, sorted) stays one input a row, as padded. `run` scatters the outputs back to the padded (B, T, …) layout;
padded positions come back as zeros, not torch's values there, which no caller reads (the mask
keeps them out of every real token's attention, of pooling, of memory and evidence).

fp32 must match torch within TOLERANCE on every output at every real (non-padded) position, with
the default packing and with the tightest one (several rows), or the runtime refuses to open. int8 (dynamic quantisation of the verified fp32 graph) cannot, so it is
checked against a looser gate (pooled-embedding cosine ≥ INT8_MIN_COSINE) and is opt-in only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
import warnings
from pathlib import Path

import torch

from softknn.common.errors import ModelRuntimeError, UnsupportedModel
from softknn.common.file_lock import exclusive_lock
from softknn.model.attention import CaptureKV, bind_hook
from softknn.model.backends import RESUMABLE_TYPES, PlainPass, TokenBatch

EXPORT_VERSION = 2  # bump when the graph's inputs/outputs or the export recipe change
TOLERANCE = 1e-4  # fp32: max |onnx − torch| over every output
INT8_MIN_COSINE = 0.95  # int8: min cosine of the pooled embeddings to torch's on VERIFY_TEXTS: a gate
# against a broken export, not a quality claim (measured: 0.979 worst with per-channel weights, 0.93
# per-tensor; quality cost on Banking77/ObliQA in docs/benchmarks.md)
OPSET = 18
# A packed row holds up to k × the batch's longest input T tokens (k in PACK_WIDTHS, k·T ≤ PACK_MAX):
# the k of least estimated cost R·W·(1 + W/PACK_ATTENTION) for R rows of W tokens.
PACK_WIDTHS = (1, 2, 4, 8)
PACK_MAX = 256
PACK_ATTENTION = 460  # measured: a token in a W-wide row costs (1 + W/460) × its GEMMs (W 12..128, 1 thread)
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


def graph_inputs(encoder) -> list[str]:
    """The packed graph's inputs, each (R, W) int64: the token features but the mask, then
    position_ids (torch's, from the padded batch) and segment_ids (the token's sequence, -1 = filler)."""
    return [k for k in encoder.onnx_inputs if k != "attention_mask"] + ["position_ids", "segment_ids"]


def _position_ids(encoder, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) the position ids torch's embeddings use for this padded batch."""
    emb = encoder.model.embeddings
    if hasattr(emb, "create_position_ids_from_input_ids") and getattr(emb, "padding_idx", None) is not None:
        return emb.create_position_ids_from_input_ids(input_ids, emb.padding_idx)  # RoBERTa family
    return torch.arange(input_ids.shape[1]).expand_as(input_ids)  # BERT: absolute 0..T-1


def _first_fit(lengths: list[int], cap: int) -> tuple[list[int], list[int], int, int]:
    """Each sequence's row and first column, first fit decreasing into rows of `cap`; rows R, width W."""
    row, off = [0] * len(lengths), [0] * len(lengths)
    fill: list[int] = []  # tokens per row
    for b in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        r = next((r for r, f in enumerate(fill) if f + lengths[b] <= cap), len(fill))
        if r == len(fill):
            fill.append(0)
        row[b], off[b] = r, fill[r]
        fill[r] += lengths[b]
    return row, off, len(fill), max(max(fill, default=1), 1)


def _cost(R: int, W: int) -> float:
    return R * W * (1 + W / PACK_ATTENTION)


class Packing:
    """A padded (B, T) batch packed into (R, W) rows without its padding (see the module doc).

    feeds: the graph's inputs (numpy int64); src/dst: each real token's flat index in the packed
    (R·W) and in the padded (B·T) layout, in the same order."""

    def __init__(self, encoder, features: dict[str, torch.Tensor], width: int | None = None):
        mask = features["attention_mask"].bool().cpu()  # (B, T)
        B, T = mask.shape
        self.shape = (B, T)
        lengths = mask.sum(1).tolist()
        if width is None:  # the estimated cheapest of the PACK_WIDTHS
            caps = [k * T for k in PACK_WIDTHS if k == 1 or k * T <= PACK_MAX]
            cap = min(caps, key=lambda c: _cost(*_first_fit(lengths, c)[2:]))
        else:
            cap = max(T, width)
        row, off, R, W = _first_fit(lengths, cap)
        bi, ci = mask.nonzero(as_tuple=True)  # real tokens, row-major: grouped by sequence, in order
        rank = (mask.cumsum(1) - 1)[bi, ci]  # index within its sequence
        row_t, off_t = torch.tensor(row), torch.tensor(off)
        self.src = row_t[bi] * W + off_t[bi] + rank  # flat index in (R, W)
        self.dst = bi * T + ci  # flat index in (B, T)
        names = graph_inputs(encoder)
        padded = {k: features[k].cpu() for k in names[:-2]}
        padded["position_ids"] = _position_ids(encoder, features["input_ids"].cpu())
        feeds = {k: torch.zeros(R * W, dtype=torch.long) for k in names[:-1]}
        for k, v in padded.items():
            feeds[k][self.src] = v[bi, ci].long()
        segment = torch.full((R * W,), -1, dtype=torch.long)
        segment[self.src] = bi  # the sequence's batch index: unique, so one segment per sequence
        feeds["segment_ids"] = segment
        self.rows = (R, W)
        self.feeds = {k: v.view(R, W).numpy() for k, v in feeds.items()}

    def unpack(self, name: str, a: torch.Tensor) -> torch.Tensor:
        """A packed output back in the padded layout: hidden (R, W, C) -> (B, T, C); query/key/value
        (R, nh, W, hs) -> (B, nh, T, hs). Padded positions are zero."""
        (B, T), (R, W) = self.shape, self.rows
        if name.startswith("hidden"):
            out = a.new_zeros(B * T, a.shape[-1])
            out.index_copy_(0, self.dst, a.reshape(R * W, -1).index_select(0, self.src))
            return out.view(B, T, -1)
        nh, hs = a.shape[1], a.shape[3]
        out = a.new_zeros(B * T, nh, hs)
        out.index_copy_(0, self.dst, a.transpose(1, 2).reshape(R * W, nh, hs).index_select(0, self.src))
        return out.view(B, T, nh, hs).transpose(1, 2)


class _Layers(torch.nn.Module):
    """The module exported: embeddings, then each layer with its q/k/v captured (BERT family),
    on packed rows (graph_inputs) with block-diagonal attention."""

    def __init__(self, encoder):
        super().__init__()
        self.model = encoder.model
        self.attn = encoder.attention_modules
        self.inputs = graph_inputs(encoder)

    @staticmethod
    def mask(seg: torch.Tensor) -> torch.Tensor:
        """(R, 1, W, W) bool, the sdpa form: a token sees the tokens of its own sequence only."""
        return seg[:, None, :, None] == seg[:, None, None, :]

    def forward(self, *features):
        feats = dict(zip(self.inputs, features, strict=True))
        seg = feats["segment_ids"]  # (R, W)
        hidden = self.model.embeddings(input_ids=feats["input_ids"], token_type_ids=feats.get("token_type_ids"),
                                       position_ids=feats["position_ids"])
        mask4d = self.mask(seg)
        hiddens, qkv = [hidden], []
        for i, layer in enumerate(self.model.encoder.layer):
            hook = CaptureKV(self.attn[i])
            with bind_hook(hook):
                out = layer(hidden, attention_mask=mask4d)
            hidden = out[0] if isinstance(out, tuple) else out  # (B, T, C)
            hiddens.append(hidden)
            qkv += [hook.query, hook.key, hook.value]  # (B, nh, T, hs) each
        return (*hiddens, *qkv)


class OnnxForward:
    """The transformer of `encoder` in ONNX Runtime; `run(features)` -> (hidden_states, q, k, v).

    hidden_states[i] is layer i's input (B, T, C), hidden_states[-1] the last hidden state;
    q[i], k[i], v[i] (B, nh, T, hs) are layer i's attention projections. The graph runs the batch
    packed (Packing); every output is zero at padded positions, where torch has values no caller reads.
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
        if encoder.model_type not in RESUMABLE_TYPES or not hasattr(encoder.model, "embeddings"):
            raise UnsupportedModel(f"{encoder.path}: model.runtime=onnx supports BERT-family models "
                                   f"({', '.join(sorted(RESUMABLE_TYPES))}), not {encoder.model_type!r}")
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
        so.intra_op_num_threads = max(1, threads)  # as torch: model.threads, resolved by the caller
        so.inter_op_num_threads = 1
        # Pool threads that wait sleep instead of spinning: on a busy box a spinning thread burns the
        # core the event loop or another worker needs (docs/benchmarks.md, contention).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
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
        """Export (fp32), quantise (int8), write atomically with a sidecar of checksums.

        Once per cache folder: processes opening the same model at once (a test session's servers,
        a node's replicas) take a lock, and the one that waited finds the file and uses it. The
        sidecar is in place before the model file appears, so a reader that sees the file sees its
        record."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.cache_dir / ".export.lock"):
            if self.path.exists():  # another process exported it while this one waited
                return
            fp32 = self.path if self.precision == "fp32" else self.path.with_name(self.path.name.replace("-int8", "-fp32"))
            if not fp32.exists():
                tmp = fp32.with_name(f"{fp32.name}.tmp-{uuid.uuid4().hex[:8]}")
                try:
                    self._export_fp32(tmp)
                    self._write_sidecar(tmp, fp32, source=None)
                    os.replace(tmp, fp32)
                finally:
                    tmp.unlink(missing_ok=True)
            if self.precision == "int8":
                from onnxruntime.quantization import QuantType, quantize_dynamic

                self._check_sidecar(fp32)
                tmp = self.path.with_name(f"{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
                try:
                    # weights only (MatMul), per output channel: per-tensor scales cost 5x the cosine gap
                    quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                                     op_types_to_quantize=["MatMul"])
                    self._write_sidecar(tmp, self.path, source=fp32)
                    os.replace(tmp, self.path)
                finally:
                    tmp.unlink(missing_ok=True)

    def _export_fp32(self, out: Path) -> None:
        enc = self.encoder
        batch = enc.tokenize(VERIFY_TEXTS[0])  # padded: the traced graph must keep the mask
        packed = Packing(enc, batch.features, width=0)  # tightest packing: several rows, several segments
        inputs = graph_inputs(enc)
        args = tuple(torch.from_numpy(packed.feeds[k]) for k in inputs)
        names = self.output_names()
        axes = {k: {0: "batch", 1: "tokens"} for k in inputs}
        axes |= {k: ({0: "batch", 1: "tokens"} if k.startswith("hidden") else {0: "batch", 2: "tokens"}) for k in names}
        # The tracer warns at Python-bool shape checks (sdpa's `q_length > 1 and attention_mask is None`):
        # with the mask always passed they are constant, and _verify checks the graph at other shapes.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(_Layers(enc).eval(), args, str(out), input_names=inputs,
                              output_names=names, dynamic_axes=axes, opset_version=OPSET, dynamo=False)

    def output_names(self) -> list[str]:
        return ([f"hidden_{i}" for i in range(self.n + 1)]
                + [f"{w}_{i}" for i in range(self.n) for w in ("query", "key", "value")])

    def _write_sidecar(self, written: Path, path: Path, *, source: Path | None) -> None:
        """The record of `written` (checksum, size), atomically, as the sidecar of `path` it becomes."""
        meta = {"export_version": EXPORT_VERSION, "fingerprint": self.encoder.info.fingerprint,
                "precision": "int8" if source else "fp32", "sha256": _sha256(written), "bytes": written.stat().st_size,
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
    def run(self, features: dict[str, torch.Tensor], names: list[str] | None = None, *,
            width: int | None = None) -> dict[str, torch.Tensor]:
        """The named outputs (default all) for a tokenized (padded) batch, as CPU torch tensors in the
        padded layout, zero at padded positions; `width` fixes the row capacity (at least the longest
        input; 0 = the longest input) instead of the estimated cheapest."""
        packed = Packing(self.encoder, features, width)
        names = names or self.outputs
        got = self.session.run(names, packed.feeds)
        return {k: packed.unpack(k, torch.from_numpy(a)) for k, a in zip(names, got, strict=True)}

    def plain(self, batch: TokenBatch, capture_layer: int | None, keep_hidden: bool) -> PlainPass:
        """The encoder's plain pass from this graph (softknn.model.backends.PlainForward): the same fields
        and shapes as torch's, zeros at padded positions, which no caller reads (module doc)."""
        n = self.n
        names = [f"hidden_{i}" for i in range(n + 1)] if keep_hidden else [f"hidden_{n}"]
        if capture_layer is not None:
            names += [f"{w}_{capture_layer}" for w in ("query", "key", "value")]
        out = self.run(batch.features, names)
        tokens = out[f"hidden_{n}"]  # (B, T, C)
        qkv = [out.get(f"{w}_{capture_layer}") for w in ("query", "key", "value")]  # (B, nh, T, hs) | None
        return PlainPass(
            embedding=self.encoder.pool(batch, tokens),
            token_embeddings=tokens,
            hidden_states=tuple(out[f"hidden_{i}"] for i in range(n + 1)) if keep_hidden else None,
            query=qkv[0], key=qkv[1], value=qkv[2],
            capture_layer=capture_layer,
        )

    def _verify(self) -> dict:
        """Every output at every real position against torch on VERIFY_TEXTS, packed as served and
        packed tightest (several rows); refuse to open on a mismatch (see module doc)."""
        enc = self.encoder
        worst, worst_name, cos = 0.0, "", 1.0
        for texts in VERIFY_TEXTS:
            batch = enc.tokenize(texts)
            ref = enc.torch_layers(batch)
            real = batch.mask  # (B, T)
            for width in (None, 0):
                got = self.run(batch.features, width=width)
                for name in self.outputs:
                    keep = real[:, :, None] if name.startswith("hidden") else real[:, None, :, None]
                    d = float((got[name] - ref[name]).abs().masked_fill(~keep, 0).max())
                    d = math.inf if math.isnan(d) else d
                    if d > worst:
                        worst, worst_name = d, name
                last = f"hidden_{self.n}"
                e_ref, e_got = enc.pool(batch, ref[last]), enc.pool(batch, got[last])  # (B, D) normalised
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

