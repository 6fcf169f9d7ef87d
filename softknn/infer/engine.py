"""Knowledge-augmented inference: encode → k-NN over the KB → fused forward → evidence.

One `Engine` holds a model and a bundle; `infer` takes a batch of texts, each with its own
parameters (the service's micro-batches mix requests), and returns one `InferResult` (softknn.infer.results) per text —
the same object `softknn query --json` prints and `POST /v1/infer` returns.

The retrieval needs the bundle alone and lives in softknn.retrieval.search (InferParams, Retrieval,
Retriever; re-exported here): the Engine adds the model, the query embedding before it and the
fused pass with its evidence and prediction after.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from softknn.common.errors import BundleError
from softknn.infer.evidence import (
    ChunkWords,
    effective_k,
    evidence_items,
    evidence_items_reference,
    label_scores,
    weight_entropy,
)
from softknn.infer.results import Diagnostics, InferResult, Neighbour, Prediction, Token, VersusPlain
from softknn.model.attention import fused_attention
from softknn.model.backends import MemoryStore, ModelForward, PlainPass, TokenBatch
from softknn.retrieval.scoring import best
from softknn.retrieval.search import MIXING, InferParams, ResolvedParams, Retrieval, Retriever  # noqa: F401 (re-exported)
from softknn.storage.layout import Bundle
from softknn.storage.manifest import Manifest

if TYPE_CHECKING:
    from softknn.storage.shards import ShardedBundle

NEAREST_SHOWN = 5  # with return_tokens: KB chunks nearest the plain and the augmented embedding
GROUP_SIZE = 4  # texts per forward pass when a batch is split by length (Engine.infer)


def check_numerics(manifest: Manifest, info, path) -> None:
    """A bundle's K/V and embeddings and the served queries must come from the same numerics.

    fp32 torch and fp32 onnx count as the same: the onnx runtime is verified against torch within
    1e-4 whenever it opens (softknn.model.onnx_forward). int8 differs by far more, so it never mixes.
    Older bundles carry no precision: they were built by torch in fp32.
    """
    built, runtime = manifest.model.precision, manifest.model.runtime
    if built != info.precision:
        raise BundleError(f"{path}: built with {runtime} {built} numerics, but the model runs {info.runtime} "
                          f"{info.precision}; keys/values and queries must share numerics: rebuild the bundle "
                          f"with SOFTKNN_MODEL__PRECISION={info.precision} or serve it with "
                          f"SOFTKNN_MODEL__PRECISION={built}", field="bundle")


class Engine:
    """A model (ModelForward) over a bundle: its retrieval (Retriever: ChunkSearch, BM25) and its
    memory (MemoryStore), the seams of softknn.model.backends."""

    def __init__(self, encoder: ModelForward, bundle: Bundle | ShardedBundle):
        if bundle.manifest.model.fingerprint != encoder.info.fingerprint:
            raise BundleError(f"{bundle.path}: built with other model weights than {encoder.info.name}")
        check_numerics(bundle.manifest, encoder.info, bundle.path)
        self.encoder: ModelForward = encoder
        self.bundle = bundle
        self.layer = encoder.check_layer(bundle.memory_layer)
        self.retriever = Retriever(bundle)
        assert bundle.kv is not None, "a loaded bundle has its memory store"
        self.memory: MemoryStore = bundle.kv
        self.memory.attach(encoder, self.layer)  # a hidden-state or recompute memory computes K/V with this model
        self.words = ChunkWords(bundle)  # each chunk's words for the evidence spans, kept per chunk row

    # --- retrieval: the bundle's alone (softknn.retrieval.search.Retriever) -----------------------------
    def resolve(self, params: list[InferParams]) -> list[ResolvedParams]:
        """Validated, with the retrieval and temperature this bundle serves them with."""
        return self.retriever.resolve(params)

    def retrieve(self, xq: np.ndarray, params: list[ResolvedParams], texts: list[str] | None = None) -> Retrieval:
        """R and w_db per input (params resolved): Retriever.retrieve."""
        return self.retriever.retrieve(xq, params, texts)

    def matched_words(self, retr: Retrieval, b: int, row: int) -> list[str] | None:
        """The input's words (as written, first occurrence) whose term occurs in chunk `row`."""
        return self.retriever.matched_words(retr, b, row)

    # --- the fused pass -----------------------------------------------------------------------
    def infer(self, texts: list[str], params: InferParams | list[InferParams], *,
              group_size: int = GROUP_SIZE) -> list[InferResult]:
        """One result per text. More than `group_size` texts run as passes of at most that many,
        shortest texts together (by characters), answers in the input order.

        Every pass pads its texts to its longest and its retrieved chunks to its longest chunk,
        so one wide pass over mixed lengths wastes work. `python -m bench grouping` (Banking77 test
        texts, 1 thread, CPU ms per text, one pass → sorted passes of 4): a micro-batch of 8
        9.2 → 8.5, of 16 11.3 → 8.5, of 32 11.6 → 7.8 (passes of 8: 7.5; one text per pass:
        12.7–13.4). A text's answer does not depend on its pass-mates beyond float round-off
        (tests/core/test_engine.py, tests/service/test_concurrency.py).
        """
        if isinstance(params, InferParams):
            params = [params] * len(texts)
        if len(params) != len(texts):
            raise ValueError("one InferParams per text")
        resolved = self.resolve(params)
        if len(texts) > group_size > 0:
            order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
            out: list[InferResult | None] = [None] * len(texts)
            for g in range(0, len(order), group_size):
                idx = order[g : g + group_size]
                for i, r in zip(idx, self._infer([texts[i] for i in idx], [resolved[i] for i in idx], idx), strict=True):
                    out[i] = r
            return out  # type: ignore[return-value]
        return self._infer(texts, resolved)

    def _infer(self, texts: list[str], params: list[ResolvedParams], positions: list[int] | None = None) -> list[InferResult]:
        batch = self.encoder.tokenize(texts, truncate=[p.truncate for p in params], positions=positions)
        # the memory layer's q, k, v are kept: the fused pass reuses them (Encoder._resume)
        plain = self.encoder.forward_plain(batch, keep_hidden=True, capture_layer=self.layer)
        retr = self.retrieve(plain.embedding.float().cpu().numpy(), params, texts)
        return self.fuse(batch, plain, retr, params)

    def fuse(self, batch: TokenBatch, plain: PlainPass, retr: Retrieval, params: list[ResolvedParams]) -> list[InferResult]:
        dev = self.encoder.device
        memory = self.memory.gather(retr.rows, retr.weights, dev)
        alpha = torch.tensor([p.alpha for p in params], device=dev)
        joint = torch.tensor([p.mixing == "joint" for p in params], device=dev)
        captured = {}

        def fuse(q, k, v, scaling):  # the memory layer's attention, memory passed in
            fr = fused_attention(q, k, v, batch.mask.to(dev), memory, alpha=alpha, joint=joint, scaling=scaling)
            captured["fr"] = fr
            return fr.out

        emb, tokens = self.encoder.forward_fused(batch, self.layer, fuse, plain)
        fr = captured["fr"]
        return [self.result(b, batch, fr, emb, tokens, retr, params[b], plain.embedding) for b in range(len(params))]

    def versus_plain(self, e_plain: np.ndarray, e_aug: np.ndarray, n: int = NEAREST_SHOWN,
                     rows: np.ndarray | None = None) -> VersusPlain:
        """What the KB changed in one input's output: cos(e, e') and ‖e' − e‖ between the plain
        model's embedding e and the knowledge-augmented e', and the n nearest KB chunks of each by
        exact search (e·e_c, e'·e_c), among `rows` only where given (a filter's). The label scores are not here: they come from w_db over R,
        which is retrieved with e and so is the same with or without the memory."""
        e, e2 = np.asarray(e_plain, dtype=np.float64), np.asarray(e_aug, dtype=np.float64)  # (D,)
        if rows is None:
            D, I = self.retriever.index.search(np.stack([e, e2]), n, exact=True)  # (2, n)
        else:  # a filtered request: the nearest among the chunks that pass it
            S = self.retriever.index.similarities(np.stack([e, e2]).astype(np.float32)).numpy()[:, rows]  # (2, |rows|)
            found = [best(S[j], rows, min(n, len(rows))) for j in range(2)]
            D, I = np.array([f[0] for f in found]), np.array([f[1] for f in found])

        def near(j: int) -> list[Neighbour]:
            return [Neighbour(self.bundle.chunks[i]["chunk_id"], self.bundle.chunks[i].get("label"), float(s))
                    for s, i in zip(D[j], I[j], strict=True) if i >= 0]

        return VersusPlain(cosine=float(e @ e2 / (np.linalg.norm(e) * np.linalg.norm(e2))),
                           l2=float(np.linalg.norm(e2 - e)), nearest_plain=near(0), nearest_augmented=near(1))

    def result(self, b, batch, fr, emb, tokens, retr: Retrieval, p: ResolvedParams, plain_emb=None, *,
               reference: bool = False) -> InferResult:
        """Input b's InferResult from the fused pass's outputs (`fuse`'s last step: diagnostics, evidence,
        labels; public for the benchmarks that time it). `reference`: the evidence by
        evidence_items_reference (the test and the benchmark that compare the two paths)."""
        valid = batch.mask[b].to(fr.out.device)
        rows = retr.rows[b]
        w = retr.weights[b]
        S = len(rows)
        weights = torch.zeros(fr.gate_mem.shape[-1])  # (S_max,) this input's w_db, zero-padded
        weights[:S] = torch.tensor(w)
        h_db = weight_entropy(w)
        h_att = float(fr.entropy[b][:, valid].mean())
        mem_share_tok = fr.gate_mem[b].sum(-1)  # (nh, T)
        diag = Diagnostics(
            memory_share=float(mem_share_tok[:, valid].mean()),
            retrieved=S,
            k=p.k,
            alpha=p.alpha if p.mixing == "fixed" else None,
            mixing=p.mixing,
            knn_temperature=p.temperature,
            temperature=p.temperature,
            kernel=p.kernel,
            threshold=p.threshold,
            retrieval=p.retrieval,
            lexical_weight=p.lexical_weight if p.retrieval == "hybrid" else None,
            candidates=p.candidates if p.retrieval != "dense" else None,
            nearest_similarity=retr.nearest[b],
            search=retr.searched[b],
            memory_layer=self.layer,
            w_db_entropy=h_db,
            w_db_effective_k=effective_k(h_db),
            attention_entropy=h_att,
            attention_effective_k=math.exp(h_att),
            attention_entropy_intra=float(fr.entropy_in[b][:, valid].mean()),
            truncation_bound=retr.bound[b],
            filtered=retr.filtered[b],
            n_tokens=int(batch.n_tokens[b]),
            truncated=bool(batch.truncated[b]),
            sources=dict(p.sources),
        )
        common = dict(batch=batch, bundle=self.bundle, rows=rows, scores=retr.scores[b], weights=weights, alpha=p.alpha,
                      joint=p.mixing == "joint", n_items=p.evidence, n_spans=p.spans)
        if reference:
            evidence = evidence_items_reference(fr, b, **common, why=lambda s: self._why_reference(retr, b, s))
        else:
            evidence = evidence_items(fr, b, **common, why=lambda slots: self._why(retr, b, slots), words=self.words)
        scores, verdict = None, Prediction(None, False)
        if self.bundle.labels:
            scores = label_scores([self.bundle.chunks[r].get("label") for r in rows], w)
            verdict = self._predict(scores, p, retr.nearest[b])
        extra: dict[str, Any] = {}
        if p.return_tokens:
            n = int(batch.n_tokens[b])
            extra["tokens"] = [
                Token(index=t, text=batch.texts[b][s:e], start=s, end=e, special=bool(batch.special[b, t]),
                      memory_share=float(mem_share_tok[:, t].mean()))
                for t, (s, e) in enumerate(batch.offsets[b, :n].tolist())
            ]
            extra["token_embeddings"] = tokens[b, :n].float().cpu().tolist()
            extra["head_memory_share"] = mem_share_tok[:, :n].float().cpu().tolist()  # (nh, n)
            if plain_emb is not None:
                extra["versus_plain"] = self.versus_plain(
                    plain_emb[b].float().cpu().numpy(), emb[b].float().cpu().numpy(),
                    rows=None if p.filter is None else self.retriever.passing(p.filter))
        return InferResult(embedding=emb[b].float().cpu().tolist(), evidence=evidence, diagnostics=diag,
                           label_scores=scores, prediction=verdict.prediction, abstained=verdict.abstained,
                           abstain_reason=verdict.abstain_reason, **extra)

    def _why(self, retr: Retrieval, b: int, slots: list[int]) -> list[dict]:
        """Why chunks R[s] (s in slots) of input b were retrieved: their dense and BM25 scores, the words
        that matched (the postings searched once for all of them)."""
        bm25 = retr.bm25[b]
        matched = self.retriever.matched_words_rows(retr, b, [retr.rows[b][s] for s in slots])
        return [{"dense_similarity": retr.dense[b][s], "bm25": None if bm25 is None else bm25[s], "matched_terms": words}
                for s, words in zip(slots, matched, strict=True)]

    def _why_reference(self, retr: Retrieval, b: int, s: int) -> dict:
        """`_why` of one slot, its matched words by `matched_words`."""
        bm25 = retr.bm25[b]
        return {"dense_similarity": retr.dense[b][s], "bm25": None if bm25 is None else bm25[s],
                "matched_terms": self.matched_words(retr, b, retr.rows[b][s])}

    def _predict(self, scores: dict[str, float], p: ResolvedParams, s_1: float) -> Prediction:
        """The top label, or an explicit abstain.

        With the bundle's calibration (softknn calibrate): abstain when the nearest chunk's
        similarity s_1 is below `min_similarity` (out of domain: w_db is normalised over R, so a
        far-away neighbourhood can still vote confidently) or the top label score is below the
        threshold. docs/quality.md: this gated rule rejects 99.9% of out-of-domain Banking77
        queries at a 0.97% in-scope loss, the score-only rule 42.7%. A request's own
        abstain_threshold keeps the score-only rule.
        """
        cal = self.bundle.manifest.calibration
        thr = p.abstain_threshold
        s_min = None
        if thr is None:
            thr = cal.abstain_threshold
            s_min = cal.min_similarity
            if s_min is not None and cal.abstain_threshold_gated is not None:
                thr = cal.abstain_threshold_gated
        if not scores:
            return Prediction(None, True, "no labelled chunk in R")
        if s_min is not None and s_1 < s_min:
            return Prediction(None, True, f"nearest KB chunk similarity {s_1:.3f} < {s_min:.3f} (out of domain)")
        label, top = next(iter(scores.items()))
        if thr is not None and top < thr:
            return Prediction(None, True, f"top label score {top:.3f} < abstain threshold {thr:.3f}")
        return Prediction(label, False)
