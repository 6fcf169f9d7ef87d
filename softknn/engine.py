"""Knowledge-augmented inference: encode → k-NN over the KB → fused forward → evidence.

One `Engine` holds a model and a bundle; `infer` takes a batch of texts, each with its own
parameters (the service's micro-batches mix requests), and returns one result dict per text —
the same object `softknn query --json` prints and `POST /v1/infer` returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from softknn.attention import KERNELS, fused_attention, knn_weights_row, truncation_bound_row
from softknn.bundle import Bundle
from softknn.encoder import Encoder, PlainPass, TokenBatch
from softknn.errors import BundleError, InvalidInput
from softknn.evidence import effective_k, evidence_items, label_scores, weight_entropy

MIXING = ("fixed", "joint")
GROUP_SIZE = 4  # texts per forward pass when a batch is split by length (Engine.infer)


@dataclass(frozen=True)
class InferParams:
    alpha: float = 0.7  # seed 000 §4.3: internal attention is the more reliable, the KB a supplement
    mixing: str = "fixed"
    k: int = 8
    temperature: float = 0.05
    kernel: str = "softmax"
    exact: bool = False
    threshold: float | None = None  # hybrid top-k + threshold (seed 000 §5.3)
    hybrid_pool: int = 64  # candidates searched when a threshold is set
    evidence: int = 5
    spans: int = 5
    return_tokens: bool = False
    truncate: bool = False
    abstain_threshold: float | None = None  # None: the bundle's calibrated value

    def validate(self) -> InferParams:
        if not (0.0 <= self.alpha <= 1.0) or math.isnan(self.alpha):
            raise InvalidInput(f"alpha must be in [0, 1], got {self.alpha}", field="alpha")
        if self.mixing not in MIXING:
            raise InvalidInput(f"mixing must be one of {MIXING}, got {self.mixing!r}", field="mixing")
        if self.kernel not in KERNELS:
            raise InvalidInput(f"kernel must be one of {KERNELS}, got {self.kernel!r}", field="kernel")
        if self.k < 1:
            raise InvalidInput(f"k must be ≥ 1, got {self.k}", field="k")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise InvalidInput(f"temperature must be > 0 and finite, got {self.temperature}", field="temperature")
        if self.threshold is not None and not (0.0 < self.threshold < 1.0):
            raise InvalidInput(f"threshold must be in (0, 1), got {self.threshold}", field="threshold")
        return self


@dataclass
class Retrieval:
    rows: list[list[int]]  # R per input, in rank order
    scores: list[list[float]]  # s_c = e_q·e_c
    weights: list[list[float]]  # w_db over R
    bound: list[float]  # truncation bound per input
    searched: list[str] = field(default_factory=list)  # "exact" or the index kind


class Engine:
    def __init__(self, encoder: Encoder, bundle: Bundle):
        if bundle.manifest["model"]["fingerprint"] != encoder.info.fingerprint:
            raise BundleError(f"{bundle.path}: built with other model weights than {encoder.info.name}")
        self.encoder = encoder
        self.bundle = bundle
        self.layer = encoder.check_layer(bundle.memory_layer)

    # --- retrieval ----------------------------------------------------------------------------
    def retrieve(self, xq: np.ndarray, params: list[InferParams]) -> Retrieval:
        """R and w_db per input. Inputs sharing (exact, search size) are searched together."""
        n = len(self.bundle)
        out = Retrieval([[]] * len(params), [[]] * len(params), [[]] * len(params), [0.0] * len(params),
                        [""] * len(params))
        groups: dict[tuple[bool, int], list[int]] = {}
        for i, p in enumerate(params):
            size = min(n, max(p.k, p.hybrid_pool) if p.threshold is not None else p.k)
            groups.setdefault((p.exact, size), []).append(i)
        for (exact, size), members in groups.items():
            D, I = self.bundle.index.search(xq[members], size, exact=exact)
            kind = "exact" if exact or self.bundle.index.spec.kind == "flat" else self.bundle.index.spec.kind
            for j, i in enumerate(members):
                self._select(out, i, D[j], I[j], params[i], n, kind)
        return out

    def _select(self, out: Retrieval, i: int, D: np.ndarray, I: np.ndarray, p: InferParams, n: int, kind: str) -> None:
        keep = I >= 0
        D, I = D[keep], I[keep]
        k = min(p.k, len(I))
        if p.threshold is not None and len(I) > k:  # top-k ∪ {c in the pool : w(c) ≥ threshold}
            sel = np.arange(len(I)) < k
            sel |= knn_weights_row(D, p.temperature, p.kernel) >= p.threshold
            D, I = D[sel], I[sel]
        else:
            D, I = D[:k], I[:k]
        D = np.ascontiguousarray(D, dtype=np.float32)
        w = knn_weights_row(D, p.temperature, p.kernel)
        nz = w > 0  # compact kernels: a chunk outside the window is not in R
        out.rows[i] = I[nz].tolist()
        out.scores[i] = D[nz].tolist()
        out.weights[i] = w[nz].tolist()
        out.bound[i] = truncation_bound_row(D, n, p.temperature, p.kernel)
        out.searched[i] = kind

    # --- the fused pass -----------------------------------------------------------------------
    def infer(self, texts: list[str], params: InferParams | list[InferParams], *,
              group_size: int = GROUP_SIZE) -> list[dict]:
        """One result per text. More than `group_size` texts run as passes of at most that many,
        shortest texts together (by characters), answers in the input order.

        Every pass pads its texts to its longest and its retrieved chunks to its longest chunk,
        so one wide pass over mixed lengths wastes work. `python -m bench.grouping` (Banking77 test
        texts, 1 thread, CPU ms per text, one pass → sorted passes of 4): a micro-batch of 8
        9.2 → 8.5, of 16 11.3 → 8.5, of 32 11.6 → 7.8 (passes of 8: 7.5; one text per pass:
        12.7–13.4). A text's answer does not depend on its pass-mates beyond float round-off
        (tests/core/test_engine.py, tests/service/test_concurrency.py).
        """
        if isinstance(params, InferParams):
            params = [params] * len(texts)
        if len(params) != len(texts):
            raise ValueError("one InferParams per text")
        for p in params:
            p.validate()
        if len(texts) > group_size > 0:
            order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
            out: list[dict | None] = [None] * len(texts)
            for g in range(0, len(order), group_size):
                idx = order[g : g + group_size]
                for i, r in zip(idx, self._infer([texts[i] for i in idx], [params[i] for i in idx], idx), strict=True):
                    out[i] = r
            return out  # type: ignore[return-value]
        return self._infer(texts, params)

    def _infer(self, texts: list[str], params: list[InferParams], positions: list[int] | None = None) -> list[dict]:
        batch = self.encoder.tokenize(texts, truncate=[p.truncate for p in params], positions=positions)
        # the memory layer's q, k, v are kept: the fused pass reuses them (Encoder._resume)
        plain = self.encoder.forward_plain(batch, keep_hidden=True, capture_layer=self.layer)
        retr = self.retrieve(plain.embedding.float().cpu().numpy(), params)
        return self.fuse(batch, plain, retr, params)

    def fuse(self, batch: TokenBatch, plain: PlainPass, retr: Retrieval, params: list[InferParams]) -> list[dict]:
        dev = self.encoder.device
        memory = self.bundle.kv.gather(retr.rows, retr.weights, dev)
        alpha = torch.tensor([p.alpha for p in params], device=dev)
        joint = torch.tensor([p.mixing == "joint" for p in params], device=dev)
        captured = {}

        def fuse(q, k, v, scaling):  # the memory layer's attention, memory passed in
            fr = fused_attention(q, k, v, batch.mask.to(dev), memory, alpha, joint, scaling)
            captured["fr"] = fr
            return fr.out

        emb, tokens = self.encoder.forward_fused(batch, self.layer, fuse, plain)
        fr = captured["fr"]
        return [self._result(b, batch, fr, emb, tokens, retr, params[b]) for b in range(len(params))]

    def _result(self, b, batch, fr, emb, tokens, retr: Retrieval, p: InferParams) -> dict:
        valid = batch.mask[b].to(fr.out.device)
        rows = retr.rows[b]
        w = retr.weights[b]
        S = len(rows)
        weights = torch.zeros(fr.gate_mem.shape[-1])  # (S_max,) this input's w_db, zero-padded
        weights[:S] = torch.tensor(w)
        h_db = weight_entropy(w)
        h_att = float(fr.entropy[b][:, valid].mean())
        mem_share_tok = fr.gate_mem[b].sum(-1)  # (nh, T)
        diag = {
            "memory_share": float(mem_share_tok[:, valid].mean()),
            "retrieved": S,
            "k": p.k,
            "alpha": p.alpha if p.mixing == "fixed" else None,
            "mixing": p.mixing,
            "temperature": p.temperature,
            "kernel": p.kernel,
            "threshold": p.threshold,
            "search": retr.searched[b],
            "memory_layer": self.layer,
            "w_db_entropy": h_db,
            "w_db_effective_k": effective_k(h_db),
            "attention_entropy": h_att,
            "attention_effective_k": math.exp(h_att),
            "attention_entropy_intra": float(fr.entropy_in[b][:, valid].mean()),
            "truncation_bound": retr.bound[b],
            "n_tokens": int(batch.n_tokens[b]),
            "truncated": bool(batch.truncated[b]),
        }
        labels = [self.bundle.chunks[r].get("label") for r in rows]
        result = {
            "embedding": emb[b].float().cpu().tolist(),
            "evidence": evidence_items(fr, b, batch, self.bundle, rows, retr.scores[b], weights,
                                       p.alpha, p.mixing == "joint", p.evidence, p.spans),
            "diagnostics": diag,
            "label_scores": None,
            "prediction": None,
            "abstained": False,
        }
        if self.bundle.labels:
            scores = label_scores(labels, w)
            result["label_scores"] = scores
            result.update(self._predict(scores, p, max(retr.scores[b], default=-1.0)))
        if p.return_tokens:
            n = int(batch.n_tokens[b])
            result["tokens"] = [
                {"index": t, "text": batch.texts[b][s:e], "start": s, "end": e, "special": bool(batch.special[b, t]),
                 "memory_share": float(mem_share_tok[:, t].mean())}
                for t, (s, e) in enumerate(batch.offsets[b, :n].tolist())
            ]
            result["token_embeddings"] = tokens[b, :n].float().cpu().tolist()
            result["head_memory_share"] = mem_share_tok[:, :n].float().cpu().tolist()  # (nh, n)
        return result

    def _predict(self, scores: dict[str, float], p: InferParams, s_1: float) -> dict:
        """The top label, or an explicit abstain.

        With the bundle's calibration (softknn calibrate): abstain when the nearest chunk's
        similarity s_1 is below `min_similarity` (out of domain: w_db is normalised over R, so a
        far-away neighbourhood can still vote confidently) or the top label score is below the
        threshold. docs/quality.md: this gated rule rejects 99.9% of out-of-domain Banking77
        queries at a 0.97% in-scope loss, the score-only rule 42.7%. A request's own
        abstain_threshold keeps the score-only rule.
        """
        cal = self.bundle.manifest.get("calibration", {}) or {}
        thr = p.abstain_threshold
        s_min = None
        if thr is None:
            thr = cal.get("abstain_threshold")
            s_min = cal.get("min_similarity")
            if s_min is not None:
                thr = cal.get("abstain_threshold_gated", thr)
        if not scores:
            return {"prediction": None, "abstained": True, "abstain_reason": "no labelled chunk in R"}
        if s_min is not None and s_1 < s_min:
            return {"prediction": None, "abstained": True,
                    "abstain_reason": f"nearest KB chunk similarity {s_1:.3f} < {s_min:.3f} (out of domain)"}
        label, top = next(iter(scores.items()))
        if thr is not None and top < thr:
            return {"prediction": None, "abstained": True,
                    "abstain_reason": f"top label score {top:.3f} < abstain threshold {thr:.3f}"}
        return {"prediction": label, "abstained": False}
