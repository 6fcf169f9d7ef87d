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
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch

from softknn.infer.results import EvidenceItem, QueryToken, Span
from softknn.model.attention import FusedResult, entropy


def influence_reference(fr: FusedResult, b: int, valid: torch.Tensor | slice, *, weights: torch.Tensor, alpha: float,
                        joint: bool) -> torch.Tensor:
    """Relative change of the layer's attention output when each slot is removed, (S,): every slot,
    attn_db summed from them (the plain form of `influence`)."""
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


CONDITION = 1e3  # w/(1−w) beyond which `influence` defers to influence_reference (w ≥ 0.999)


def influence(fr: FusedResult, b: int, valid: torch.Tensor | slice, slots: torch.Tensor, p: torch.Tensor, *,
              weights: torch.Tensor, alpha: float, joint: bool) -> torch.Tensor:
    """`influence_reference` of the given slots alone, (m,); p (nh, m, n, Lm): their p_c at the valid
    query positions. Only their attn_c is computed: in fixed mode (1−α)·attn_db is the forward's own
    memory output (FusedResult.mem_out), so Δ = w_c/(1−w_c)·(mem_out − (1−α)·attn_c), and with c the
    only chunk Δ = (1−α)·attn_intra − mem_out.

    Δ multiplies a difference of near-equal sums by w/(1−w) (or g/(1−g)): float32 round-off of
    ~1e-7 in either sum grows by that factor. Where some slot's factor passes CONDITION the two
    forms would part by more than 1e-5, so influence_reference answers for all of them."""
    gate = fr.gate_mem[b][:, valid][:, :, slots].transpose(1, 2) if joint else weights[slots]  # (nh, m, n) or (m,)
    if bool((gate >= 1 - 1 / CONDITION).any()):
        return influence_reference(fr, b, valid, weights=weights, alpha=alpha, joint=joint)[slots]
    out = fr.out[b][:, valid]  # (nh, n, hs)
    a_s = p @ fr.mem_value[b][:, slots]  # (nh, m, n, hs) attn_c
    norm = out.norm().clamp(min=1e-12)
    if joint:
        delta = (gate / (1 - gate).clamp(min=1e-12))[..., None] * (out[:, None] - a_s)
    else:
        w = gate.to(out.dtype)  # (m,)
        mem = fr.mem_out[b][:, valid]  # (nh, n, hs) (1−α)·attn_db
        delta = (w / (1 - w).clamp(min=1e-12))[None, :, None, None] * (mem[:, None] - (1 - alpha) * a_s)
        only = w >= 1 - 1e-7  # (m,) as in influence_reference
        if bool(only.any()):
            delta[:, only] = ((1 - alpha) * fr.attn_in[b][:, valid] - mem)[:, None]
    return delta.pow(2).sum(dim=(0, 2, 3)).sqrt() / norm  # (m,)


class Words(NamedTuple):
    """One chunk's memory tokens merged into words (`_word_spans`'s rule: subwords that touch)."""

    first: np.ndarray  # (W,) each word's first token (into the chunk's n tokens)
    length: np.ndarray  # (W,) its tokens
    start: np.ndarray  # (W,) its char span in the document
    end: np.ndarray  # (W,)
    readable: np.ndarray  # (W,) bool: `_readable` (spans offer only these)


def chunk_words(bundle, row: int) -> Words:
    """The words of chunk `row` from the bundle's token spans and the chunk's text."""
    c = bundle.chunks[row]
    st, n = int(bundle.kv.start[row]), int(bundle.kv.count[row])
    ts = np.asarray(bundle.token_spans[st : st + n], dtype=np.int64).reshape(n, 2)  # (n, 2)
    new = np.ones(n, dtype=bool)
    new[1:] = ts[1:, 0] != ts[:-1, 1]  # a token starts a word unless it touches the one before
    first = np.flatnonzero(new)
    last = np.append(first[1:], n)[: len(first)] - 1
    start, end = ts[first, 0], ts[last, 1]
    text, c0 = c["text"], c["start"]
    readable = np.array([_readable(text[s - c0 : e - c0]) for s, e in zip(start.tolist(), end.tolist(), strict=True)],
                        dtype=bool)
    return Words(first, last - first + 1, start, end, readable)


class ChunkWords:
    """`chunk_words` by chunk row, computed on first use and kept, the least recently used dropped
    beyond `size` rows. They depend on the chunk's text and token spans alone, which a bundle never
    changes: a write makes a new bundle (and the Engine over it a new cache)."""

    def __init__(self, bundle, size: int = 4096):
        self.bundle, self.size = bundle, size
        self._rows: OrderedDict[int, Words] = OrderedDict()
        self._lock = threading.Lock()  # one Engine may serve several inference threads

    def __call__(self, row: int) -> Words:
        with self._lock:
            w = self._rows.get(row)
            if w is not None:
                self._rows.move_to_end(row)
                return w
        w = chunk_words(self.bundle, row)
        with self._lock:
            self._rows[row] = w
            if len(self._rows) > self.size:
                self._rows.popitem(last=False)
        return w


LONG_WORD = 8  # tokens: numpy sums a longer run pairwise, so such a word's pulls are summed as the reference sums them


def _segment_sums(x: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """Σ_j x[..., tok[w, j]] over each word's tokens, added left to right as `sum` adds a short run
    (a pad index points at a trailing zero column: + 0.0 changes nothing). x (..., L+1), tok (W, Lw)."""
    acc = x[..., tok[:, 0]]
    for j in range(1, tok.shape[1]):
        acc = acc + x[..., tok[:, j]]
    return acc  # (..., W)


def _word_tokens(first: np.ndarray, length: np.ndarray, base: np.ndarray, pad: int) -> np.ndarray:
    """(W, Lw) token columns of each word (base[w] + first[w] + j), `pad` past its length."""
    lw = int(length.max()) if len(length) else 1
    j = np.arange(lw)
    return np.where(j < length[:, None], (base + first)[:, None] + j, pad)


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
    words: ChunkWords,
) -> list[EvidenceItem]:
    """`evidence_items_reference`, computed for what the request returns: the n_items slots with the
    largest share first, then pulls, reach and influence for those slots only, each chunk's words
    from `words` (ChunkWords) and their masses, ranking and pulls in array operations over all the
    returned items at once. `why(slots)`: for each slot, why its chunk was retrieved (Engine._why)."""
    if not rows or n_items <= 0:  # nothing asked for: skip the per-token work (bench/fused_forward.py)
        return []
    valid = batch.mask[b].cpu()  # (T,)
    g_all = fr.gate_mem[b][:, valid].cpu()  # (nh, n, S)
    share_list = g_all.mean(dim=(0, 1)).tolist()  # (S,)
    order = sorted(range(len(rows)), key=lambda s: (-share_list[s], s))[:n_items]
    dev = fr.out.device
    sel = torch.tensor(order, device=dev)
    # every position valid (an unpadded input): a view, not a boolean gather, wherever `valid` indexes
    valid_d: torch.Tensor | slice = slice(None) if bool(valid.all()) else valid.to(dev)
    p = fr.p_mem[b].transpose(1, 2).index_select(1, sel)[:, :, valid_d]  # (nh, m, n, Lm): the returned slots only
    infl = influence(fr, b, valid_d, sel, p, weights=weights.to(dev), alpha=alpha, joint=joint).tolist()
    g = g_all[:, :, sel.cpu()].transpose(1, 2)  # (nh, m, n)
    pull = (g[..., None] * p.cpu()).mean(0)  # (m, n, Lm)
    token_mass = pull.mean(1)  # (m, Lm)
    reach = torch.softmax(fr.lse_mem[b][:, valid].cpu(), dim=1).mean(0)[:, sel.cpu()]  # (n, m) softmax over queries (small: every slot)
    q_idx = valid.nonzero().flatten()
    text = batch.texts[b]
    q_tok = [("[special]" if sp else text[s:e], s, e) for (s, e), sp in
             zip(batch.offsets[b, q_idx].tolist(), batch.special[b, q_idx].tolist(), strict=True)]
    spans = _spans(pull.numpy(), token_mass.numpy(), [words(rows[s]) for s in order], n_spans)
    span_tops = _top(spans.pulls, 9, 3)
    item_tops = _top(reach.numpy().T, 6, 5)  # (m, ≤5)
    reach_l = reach.T.tolist()  # (m, n)
    pulls_l = spans.pulls.tolist()  # (N, n)
    whys = why(order)
    items = []
    for j, s in enumerate(order):
        c = bundle.chunks[rows[s]]
        ct, c0, share = c["text"], c["start"], share_list[s]
        item_spans = []
        for k in range(spans.offset[j], spans.offset[j + 1]):
            ws, we, mass, p_w = spans.start[k], spans.end[k], spans.mass[k], pulls_l[k]
            item_spans.append(Span(start=ws, end=we, text=ct[ws - c0 : we - c0], weight=mass,
                                   share=float(mass / max(share, 1e-12)),
                                   query_tokens=[QueryToken(i, *q_tok[i], p_w[i]) for i in span_tops[k]]))
        r_l = reach_l[j]
        items.append(EvidenceItem(
            rank=j,
            chunk_id=c["chunk_id"],
            doc_id=c["doc_id"],
            text=ct,
            start=c0,
            end=c["end"],
            label=c.get("label"),
            metadata=c.get("metadata") or {},
            similarity=float(scores[s]),
            weight=float(weights[s]),
            mass_share=share,
            influence=infl[j],
            spans=item_spans,
            query_tokens=[QueryToken(i, *q_tok[i], r_l[i]) for i in item_tops[j]],
            **whys[j],
        ))
    return items


class _Spans(NamedTuple):
    """The returned spans of all items, item j's at [offset[j], offset[j+1])."""

    offset: list[int]  # (m+1,)
    start: list[int]  # (N,) char span in the document
    end: list[int]
    mass: list[float]  # (N,) the word's token mass
    pulls: np.ndarray  # (N, n) float32: each query token's pull on the word


def _spans(pull: np.ndarray, token_mass: np.ndarray, words: list[Words], n_spans: int) -> _Spans:
    """Per item j (a slot of pull (m, n, Lm) and token_mass (m, Lm)): its readable words by mass
    (ties to the earlier word), the first n_spans, with their pulls; `evidence_items_reference`'s loop
    as array operations over every item's words at once."""
    m, n, lm = pull.shape
    if n_spans <= 0 or not words or not any(len(w.first) for w in words):
        return _Spans([0] * (m + 1), [], [], [], np.zeros((0, n), dtype=pull.dtype))
    item = np.concatenate([np.full(len(w.first), j) for j, w in enumerate(words)])  # (W,) each word's item
    first = np.concatenate([w.first for w in words])
    length = np.concatenate([w.length for w in words])
    tok = _word_tokens(first, length, item * lm, m * lm)  # (W, Lw) into the flat (m·Lm + 1) tokens
    flat_mass = np.append(token_mass.reshape(-1).astype(np.float64), 0.0)  # (m·Lm + 1,) the sums in float64, as Python's
    mass = _segment_sums(flat_mass, tok)  # (W,)
    keep = np.flatnonzero(np.concatenate([w.readable for w in words]))
    ranked = keep[np.lexsort((keep, -mass[keep], item[keep]))]  # by item, then mass high to low, then word
    it = item[ranked]
    rank = np.arange(len(ranked)) - np.searchsorted(it, it)  # place within its item
    chosen = ranked[rank < n_spans]  # (N,) item-major
    flat_pull = np.concatenate([pull.transpose(1, 0, 2).reshape(n, m * lm), np.zeros((n, 1), dtype=pull.dtype)],
                               axis=1)  # (n, m·Lm + 1)
    pulls = _segment_sums(flat_pull, tok[chosen]).T  # (N, n) float32
    for k in np.flatnonzero(length[chosen] >= LONG_WORD):  # as the reference sums a long run: numpy's own sum
        w = chosen[k]
        pulls[k] = pull[item[w]][:, np.arange(first[w], first[w] + length[w])].sum(-1)  # (n, L) a copy, as the reference's
    offset = np.searchsorted(item[chosen], np.arange(m + 1)).tolist()
    start = np.concatenate([w.start for w in words])[chosen].tolist()
    end = np.concatenate([w.end for w in words])[chosen].tolist()
    return _Spans(offset, start, end, mass[chosen].tolist(), pulls)


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


def evidence_items_reference(
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
    """Evidence for input b, ranked by memory-mass share, each with its spans and influence: the
    plain form of `evidence_items` (every slot's pulls, reach and influence, a loop per item and
    span). `why(s)`: why the chunk in slot s of R was retrieved: its dense_similarity, bm25 and
    matched_terms (Engine._why_reference)."""
    if not rows or n_items <= 0:  # nothing asked for: skip the per-token work (bench/fused_forward.py)
        return []
    valid = batch.mask[b].cpu()  # (T,)
    g = fr.gate_mem[b][:, valid].cpu()  # (nh, n, S)
    p = fr.p_mem[b][:, valid].cpu()  # (nh, n, S, Lm)
    pull = (g[..., None] * p).mean(0)  # (n, S, Lm)
    token_mass = pull.mean(0)  # (S, Lm)
    shares = g.mean(dim=(0, 1))  # (S,)
    reach = torch.softmax(fr.lse_mem[b][:, valid].cpu(), dim=1).mean(0)  # (n, S) softmax over queries
    infl = influence_reference(fr, b, valid.to(fr.out.device), weights=weights.to(fr.out.device), alpha=alpha, joint=joint).cpu()
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
