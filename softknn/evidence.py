"""From the fused attention's weights to evidence: chunks, word spans, query tokens, influence, labels.

All quantities average over heads and the input's non-pad query positions (`valid`):
    mass_share(c)  = mean_{h,i} g_c(h,i)                      (fixed: exactly (1−α)·w_db(c))
    token mass(t)  = mean_{h,i} g_c(h,i)·p_c(h,i,t)            (Σ_t = mass_share(c))
    pull(i, t)     = mean_h g_c(h,i)·p_c(h,i,t)                (which query tokens drew token t)
    reach(i, c)    = mean_h softmax_i(log Z_c(h,i))             (which query tokens match chunk c:
                     query i's share of the chunk's unnormalised attention; informative in fixed
                     mode too, where every query gives c the same mass (1−α)·w_db(c))
    influence(c)   = ‖Δout‖ / ‖out‖ over (h, i, hs) when c is removed and the memory weights
                     renormalise, in closed form (no second pass):
        fixed: Δ = (1−α)·w_c/(1−w_c)·(attn_db − attn_c); with c the only chunk, Δ = (1−α)(attn_intra − attn_db)
        joint: Δ = g_c/(1−g_c)·(out − attn_c)
    label_scores   = Σ_{c∈R} w_db(c)·onehot(label_c)            (Nadaraya–Watson, seed 001)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from softknn.attention import FusedResult, entropy
from softknn.results import EvidenceItem, QueryToken, Span


def influence(fr: FusedResult, b: int, valid: torch.Tensor, *, weights: torch.Tensor, alpha: float,
              joint: bool) -> torch.Tensor:
    """Relative change of the layer's attention output when each slot is removed, (S,)."""
    out = fr.out[b][:, valid]  # (nh, n, hs)
    a_s = fr.slot_attention(b)[:, valid]  # (nh, n, S, hs)
    norm = out.norm().clamp(min=1e-12)
    if joint:
        g = fr.gate_mem[b][:, valid]  # (nh, n, S)
        delta = (g / (1 - g).clamp(min=1e-12))[..., None] * (out[:, :, None, :] - a_s)
    else:
        w = weights.to(out.dtype)  # (S,)
        a_db = torch.einsum("s,hnsd->hnd", w, a_s)  # (nh, n, hs)
        coef = ((1 - alpha) * w / (1 - w).clamp(min=1e-12))[None, None, :, None]
        delta = coef * (a_db[:, :, None, :] - a_s)  # (nh, n, S, hs)
        only = w >= 1 - 1e-7  # (S,) at most one slot; its branch is computed only when it exists
        if bool(only.any()):
            delta[:, :, only] = ((1 - alpha) * (fr.attn_in[b][:, valid] - a_db))[:, :, None, :]
    return delta.pow(2).sum(dim=(0, 1, 3)).sqrt() / norm  # (S,)


def _word_spans(spans: np.ndarray, mass: np.ndarray) -> list[tuple[int, int, float, list[int]]]:
    """Merge consecutive subword tokens that touch (next.start == prev.end) into word spans."""
    words: list[tuple[int, int, float, list[int]]] = []
    for t, ((s, e), m) in enumerate(zip(spans.tolist(), mass.tolist(), strict=True)):
        if words and s == words[-1][1]:
            ps, _, pm, toks = words[-1]
            words[-1] = (ps, e, pm + m, toks + [t])
        else:
            words.append((s, e, m, [t]))
    return words


def _readable(word: str) -> bool:
    """A word a reader can use: it holds a letter or a digit. Runs of punctuation and markup
    ('---------------', '**********', '+-----') draw mass (a run of touching tokens sums theirs) but
    are not offered as spans; their mass still counts in the chunk's share."""
    return any(ch.isalnum() for ch in word)


def evidence_items(
    fr: FusedResult,
    b: int,
    *,
    batch,
    bundle,
    rows: list[int],
    scores: list[float],
    weights: torch.Tensor,
    alpha: float,
    joint: bool,
    n_items: int,
    n_spans: int,
    why,
) -> list[EvidenceItem]:
    """Evidence for input b, ranked by memory-mass share, each with its spans and influence.
    `why(s)`: why the chunk in slot s of R was retrieved: its dense_similarity, bm25 and
    matched_terms (Engine._why)."""
    if not rows or n_items <= 0:  # nothing asked for: skip the per-token work (bench/fused_forward.py)
        return []
    valid = batch.mask[b].cpu()  # (T,)
    g = fr.gate_mem[b][:, valid].cpu()  # (nh, n, S)
    p = fr.p_mem[b][:, valid].cpu()  # (nh, n, S, Lm)
    pull = (g[..., None] * p).mean(0)  # (n, S, Lm)
    token_mass = pull.mean(0)  # (S, Lm)
    shares = g.mean(dim=(0, 1))  # (S,)
    reach = torch.softmax(fr.lse_mem[b][:, valid].cpu(), dim=1).mean(0)  # (n, S) softmax over queries
    infl = influence(fr, b, valid.to(fr.out.device), weights=weights.to(fr.out.device), alpha=alpha, joint=joint).cpu()
    q_idx = valid.nonzero().flatten()
    q_spans = batch.offsets[b, q_idx].tolist()
    q_special = batch.special[b, q_idx].tolist()
    text = batch.texts[b]
    share_list = shares.tolist()  # (S,)
    order = sorted(range(len(rows)), key=lambda s: (-share_list[s], s))[:n_items]
    pull_np, reach_np, mass_np = pull.numpy(), reach.numpy(), token_mass.numpy()
    items = []
    for rank, s in enumerate(order):
        c = bundle.chunks[rows[s]]
        st, n = int(bundle.kv.start[rows[s]]), int(bundle.kv.count[rows[s]])
        tspans = np.asarray(bundle.token_spans[st : st + n])
        words = [w for w in _word_spans(tspans, mass_np[s, :n]) if _readable(c["text"][w[0] - c["start"] : w[1] - c["start"]])]
        words.sort(key=lambda w: -w[2])
        words = words[:n_spans]
        # per span, its pull from every query token (n_words, n); top 3 by (pull rounded to 1e-9, index)
        pulls = np.stack([pull_np[:, s, toks].sum(-1) for _, _, _, toks in words]) if words else np.zeros((0, 0))
        tops = _top(pulls, 9, 3)
        spans = []
        for (ws, we, m, _), p_w, top in zip(words, pulls.tolist(), tops, strict=True):
            spans.append(Span(
                start=ws,
                end=we,
                text=c["text"][ws - c["start"] : we - c["start"]],
                weight=float(m),
                share=float(m / max(share_list[s], 1e-12)),
                query_tokens=[_qtok(text, q_spans[i], q_special[i], i, p_w[i]) for i in top],
            ))
        reach_s = reach_np[:, s]  # (n,)
        reach_l = reach_s.tolist()
        top_q = _top(reach_s[None], 6, 5)[0]
        items.append(EvidenceItem(
            rank=rank,
            chunk_id=c["chunk_id"],
            doc_id=c["doc_id"],
            text=c["text"],
            start=c["start"],
            end=c["end"],
            label=c.get("label"),
            metadata=c.get("metadata") or {},
            similarity=float(scores[s]),
            weight=float(weights[s]),
            mass_share=share_list[s],
            influence=float(infl[s]),
            spans=spans,
            query_tokens=[_qtok(text, q_spans[i], q_special[i], i, reach_l[i]) for i in top_q],
            **why(s),
        ))
    return items


def _top(values: np.ndarray, decimals: int, k: int) -> list[list[int]]:
    """Per row of values (R, n): the indices of the k largest, ties (after rounding) to the lower index."""
    if values.size == 0:
        return [[] for _ in range(len(values))]
    r = np.round(values.astype(np.float64), decimals)
    idx = np.broadcast_to(np.arange(r.shape[1]), r.shape)
    return np.lexsort((idx, -r), axis=1)[:, :k].tolist()


def _qtok(text: str, span: list[int], special: bool, index: int, weight: float) -> QueryToken:
    s, e = span
    return QueryToken(index=index, text="[special]" if special else text[s:e], start=s, end=e, weight=weight)


def label_scores(labels: list[str | None], weights: list[float]) -> dict[str, float]:
    """Σ_c w_db(c)·onehot(label_c), unlabelled chunks contributing nothing; sorted high to low."""
    acc: dict[str, float] = {}
    for lab, w in zip(labels, weights, strict=True):
        if lab is not None:
            acc[lab] = acc.get(lab, 0.0) + float(w)
    return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])))


def weight_entropy(w: list[float]) -> float:
    if not w:
        return 0.0
    return float(entropy(torch.tensor(w, dtype=torch.float64)))


def effective_k(h: float) -> float:
    return math.exp(h)
