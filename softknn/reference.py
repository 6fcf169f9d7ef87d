"""Brute-force reference for the whole pipeline, beside the fast `Engine`: the contract, spelled out.

No FAISS, no batching of inputs, float64 scores over every chunk of the KB, the loop-based
fused attention, and a full second model pass (no resume from layer L). Tests hold the engine
to this with an exact index and k ≥ N (DESIGN.md: equal to float32 round-off).
"""

from __future__ import annotations

import numpy as np
import torch

from softknn.attention import fused_attention_reference, knn_weights
from softknn.bundle import Bundle
from softknn.encoder import Encoder


@torch.inference_mode()
def reference_embedding(encoder: Encoder, bundle: Bundle, text: str, *, alpha: float, mixing: str, k: int,
                        temperature: float, kernel: str = "softmax") -> tuple[np.ndarray, list[int], list[float]]:
    """(fused embedding (D,), R as chunk rows, w_db) for one text, computed the slow, obvious way."""
    e_q = encoder.st.encode([text], convert_to_numpy=True, normalize_embeddings=False)[0].astype(np.float64)
    xb = np.asarray(bundle.index.xb, dtype=np.float64)  # (N, D)
    s = xb @ e_q  # s_c = e_q·e_c over the whole KB
    order = sorted(range(len(s)), key=lambda c: (-s[c], c))[: min(k, len(s))]
    st = torch.tensor(s[order])[None]
    w = knn_weights(st, torch.ones_like(st, dtype=torch.bool), temperature, kernel)[0].tolist()
    rows = [c for c, wc in zip(order, w, strict=True) if wc > 0]
    w = [wc for wc in w if wc > 0]
    chunks = [bundle.kv.chunk(c) for c in rows]
    batch = encoder.tokenize([text])

    def fuse(q, kk, v, scaling):
        out = fused_attention_reference(q, kk, v, batch.mask, [chunks], [w], [alpha], [mixing == "joint"], scaling)
        return out.to(q.dtype)

    emb, _ = encoder.forward_fused(batch, encoder.check_layer(bundle.memory_layer), fuse, plain=None, resume=False)
    return emb[0].float().cpu().numpy(), rows, w
