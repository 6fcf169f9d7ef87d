"""Brute-force reference for the whole pipeline, beside the fast `Engine`: the contract, spelled out.

No FAISS, no batching of inputs, float64 scores over every chunk of the KB (dense, and for
hybrid/lexical retrieval BM25 by its formula over raw term counts, not the sparse index), the
loop-based fused attention, and a full second model pass (no resume from layer L). Tests hold the
engine to this with an exact index and k ≥ N (DESIGN.md: equal to float32 round-off).
"""

from __future__ import annotations

import numpy as np
import torch

from softknn.model.attention import fused_attention_reference, knn_weights
from softknn.model.encoder import Encoder
from softknn.retrieval.lexical import Analyzer, LexicalSpec, bm25_reference
from softknn.retrieval.scoring import CANDIDATES, LEXICAL_WEIGHT, scores_reference
from softknn.storage.layout import Bundle


def similarity_reference(bundle: Bundle, e_q: np.ndarray, text: str, retrieval: str = "dense",
                         lexical_weight: float = LEXICAL_WEIGHT, candidates: int = CANDIDATES) -> np.ndarray:
    """s (N,) float64 over every chunk: e_q·e_c, or the hybrid/lexical mix with BM25 from its formula."""
    d = np.asarray(bundle.index.xb, dtype=np.float64) @ np.asarray(e_q, dtype=np.float64)
    if retrieval == "dense":
        return d
    assert bundle.manifest.lexical is not None, "lexical and hybrid retrieval need the bundle's lexical index"
    spec = LexicalSpec.from_manifest(bundle.manifest.lexical.settings)
    an = Analyzer(spec)
    b = bm25_reference(an.terms(text), [an.terms(c["text"]) for c in bundle.chunks], spec)
    return scores_reference(d, b, retrieval, lexical_weight, candidates)


@torch.inference_mode()
def reference_embedding(encoder: Encoder, bundle: Bundle, text: str, *, alpha: float, mixing: str, k: int,
                        temperature: float, kernel: str = "softmax", retrieval: str = "dense",
                        lexical_weight: float = LEXICAL_WEIGHT,
                        candidates: int = CANDIDATES) -> tuple[np.ndarray, list[int], list[float]]:
    """(fused embedding (D,), R as chunk rows, w_db) for one text, computed the slow, obvious way."""
    e_q = encoder.st.encode([text], convert_to_numpy=True, normalize_embeddings=False)[0].astype(np.float64)
    s = similarity_reference(bundle, e_q, text, retrieval, lexical_weight, candidates)  # s_c over the whole KB
    order = sorted(range(len(s)), key=lambda c: (-s[c], c))[: min(k, len(s))]
    st = torch.tensor(s[order])[None]
    w = knn_weights(st, torch.ones_like(st, dtype=torch.bool), temperature, kernel)[0].tolist()
    rows = [c for c, wc in zip(order, w, strict=True) if wc > 0]
    w = [wc for wc in w if wc > 0]
    bundle.kv.attach(encoder, encoder.check_layer(bundle.memory_layer))
    chunks = [bundle.kv.chunk(c) for c in rows]  # type: ignore[attr-defined]  # every single-bundle store has chunk; the MemoryStore protocol does not name it
    batch = encoder.tokenize([text])

    def fuse(q, kk, v, scaling):
        out = fused_attention_reference(q, kk, v, batch.mask, chunks=[chunks], weights=[w], alpha=[alpha],
                                        joint=[mixing == "joint"], scaling=scaling)
        return out.to(q.dtype)

    emb, _ = encoder.forward_fused(batch, encoder.check_layer(bundle.memory_layer), fuse, plain=None, resume=False)
    return emb[0].float().cpu().numpy(), rows, w
