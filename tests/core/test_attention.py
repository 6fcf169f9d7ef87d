"""The fused attention: fast path against the loop reference, gates, kernels, bounds, entropy."""

import math

import pytest
import torch

from softknn.model.attention import (
    MemoryBatch,
    entropy,
    fused_attention,
    fused_attention_reference,
    knn_weights,
    truncation_bound,
)


def _random_case(seed=0, B=3, nh=4, T=7, hs=8, lengths=((3, 5, 2), (4,), ())):
    """Random q/k/v with padding, and per-input chunks of different lengths (input 2 has none)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, nh, T, hs, generator=g) for _ in range(3))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False  # padded input
    mask[2, 3:] = False
    chunks, weights = [], []
    for b in range(B):
        cs = [(torch.randn(nh, n, hs, generator=g), torch.randn(nh, n, hs, generator=g)) for n in lengths[b]]
        w = torch.softmax(torch.randn(len(cs), generator=g), 0).tolist() if cs else []
        chunks.append(cs)
        weights.append(w)
    S = max(len(c) for c in chunks)
    Lm = max(n for ls in lengths for n in ls)
    mem = MemoryBatch(
        key=torch.zeros(B, nh, S, Lm, hs),
        value=torch.zeros(B, nh, S, Lm, hs),
        token_mask=torch.zeros(B, S, Lm, dtype=torch.bool),
        weight=torch.zeros(B, S),
    )
    for b, cs in enumerate(chunks):
        for s, (kc, vc) in enumerate(cs):
            n = kc.shape[1]
            mem.key[b, :, s, :n], mem.value[b, :, s, :n] = kc, vc
            mem.token_mask[b, s, :n] = True
            mem.weight[b, s] = weights[b][s]
    return q, k, v, mask, mem, chunks, weights


@pytest.mark.parametrize("joint", [False, True])
def test_fast_path_equals_loop_reference(joint):
    q, k, v, mask, mem, chunks, weights = _random_case()
    alpha = [0.7, 0.3, 0.5]
    scaling = 8**-0.5
    fast = fused_attention(q, k, v, mask, mem, alpha=torch.tensor(alpha), joint=torch.tensor([joint] * 3),
                           scaling=scaling).out
    ref = fused_attention_reference(q, k, v, mask, chunks=chunks, weights=weights, alpha=alpha, joint=[joint] * 3,
                                    scaling=scaling)
    for b in range(3):
        valid = mask[b]
        assert torch.allclose(fast[b][:, valid].double(), ref[b][:, valid], atol=1e-6, rtol=0)


def test_mixed_modes_in_one_batch_equal_each_alone():
    q, k, v, mask, mem, chunks, weights = _random_case(seed=1)
    alpha, joint = torch.tensor([0.7, 0.2, 0.9]), torch.tensor([True, False, True])
    mixed = fused_attention(q, k, v, mask, mem, alpha=alpha, joint=joint, scaling=0.3).out
    ref = fused_attention_reference(q, k, v, mask, chunks=chunks, weights=weights, alpha=alpha.tolist(),
                                    joint=joint.tolist(), scaling=0.3)
    for b in range(3):
        assert torch.allclose(mixed[b][:, mask[b]].double(), ref[b][:, mask[b]], atol=1e-6, rtol=0)


def test_alpha_one_is_the_plain_attention():
    q, k, v, mask, mem, _, _ = _random_case(seed=2)
    out = fused_attention(q, k, v, mask, mem, alpha=torch.ones(3), joint=torch.zeros(3, dtype=torch.bool),
                          scaling=0.35).out
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=0.35)
    for b in range(3):
        assert torch.allclose(out[b][:, mask[b]], plain[b][:, mask[b]], atol=1e-6, rtol=0)


def test_empty_memory_keeps_the_plain_layer_in_both_modes():
    q, k, v, mask, mem, _, _ = _random_case(seed=3)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=0.5)
    for joint in (False, True):
        out = fused_attention(q, k, v, mask, mem, alpha=torch.full((3,), 0.6), joint=torch.full((3,), joint),
                              scaling=0.5).out
        assert torch.allclose(out[2][:, mask[2]], plain[2][:, mask[2]], atol=1e-6, rtol=0)  # input 2: R = ∅


def test_gates_fixed_memory_mass_is_one_minus_alpha_and_joint_sums_to_one():
    q, k, v, mask, mem, _, _ = _random_case(seed=4)
    fixed = fused_attention(q, k, v, mask, mem, alpha=torch.tensor([0.7, 0.25, 0.5]),
                            joint=torch.zeros(3, dtype=torch.bool), scaling=0.3)
    assert torch.allclose(fixed.gate_mem[0].sum(-1), torch.full((4, 7), 0.3), atol=1e-6)
    assert torch.allclose(fixed.gate_mem[1].sum(-1), torch.full((4, 7), 0.75), atol=1e-6)
    joint = fused_attention(q, k, v, mask, mem, alpha=torch.zeros(3), joint=torch.ones(3, dtype=torch.bool),
                            scaling=0.3)
    total = joint.gate_in + joint.gate_mem.sum(-1)
    assert torch.allclose(total[:2], torch.ones(2, 4, 7), atol=1e-6)


def test_entropy_chain_rule_equals_entropy_of_the_explicit_distribution():
    q, k, v, mask, mem, chunks, weights = _random_case(seed=5)
    fr = fused_attention(q, k, v, mask, mem, alpha=torch.tensor([0.6, 0.6, 0.6]),
                         joint=torch.zeros(3, dtype=torch.bool), scaling=0.4)
    b, h, i = 0, 1, 2
    p_in = torch.softmax((k[b, h] @ q[b, h, i]) * 0.4, 0)
    parts = [0.6 * p_in] + [0.4 * w * torch.softmax((kc[h] @ q[b, h, i]) * 0.4, 0) for (kc, _), w in zip(chunks[b], weights[b])]
    explicit = torch.cat(parts)
    assert explicit.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert fr.entropy[b, h, i].item() == pytest.approx(entropy(explicit).item(), abs=1e-5)


def test_softmax_weights_hand_computed():
    s = torch.tensor([[0.9, 0.8, 0.5]])
    w = knn_weights(s, torch.ones_like(s, dtype=torch.bool), 0.1, "softmax")[0]
    e = [math.exp(9), math.exp(8), math.exp(5)]
    assert w.tolist() == pytest.approx([x / sum(e) for x in e], abs=1e-7)


def test_compact_kernels_hand_computed_and_empty_window():
    s = torch.tensor([[0.9, 0.8, 0.5]])  # d² = 0.2, 0.4, 1.0
    valid = torch.ones_like(s, dtype=torch.bool)
    epa = knn_weights(s, valid, 0.5, "epanechnikov")[0]  # 1 − d²/τ = 0.6, 0.2, 0
    assert epa.tolist() == pytest.approx([0.75, 0.25, 0.0], abs=1e-7)
    uni = knn_weights(s, valid, 0.5, "uniform")[0]  # d² ≤ 0.5 for the first two
    assert uni.tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-7)
    assert knn_weights(s, valid, 0.1, "uniform")[0].tolist() == [0.0, 0.0, 0.0]


def test_truncation_bound_hand_computed_and_zero_when_r_covers_the_kb():
    s = torch.tensor([[0.9, 0.5]])
    valid = torch.ones_like(s, dtype=torch.bool)
    kept = math.exp(9) + math.exp(5)
    dropped = 8 * math.exp(5)  # 8 chunks outside R, each scoring at most 0.5
    assert truncation_bound(s, valid, 10, 0.1, "softmax")[0].item() == pytest.approx(dropped / (kept + dropped), rel=1e-5)
    assert truncation_bound(s, valid, 2, 0.1, "softmax")[0].item() == 0.0


@pytest.mark.parametrize("joint", [False, True])
def test_every_field_of_the_fast_path_equals_per_chunk_loops(joint):
    """p_c, log Z_c, attn_c (slot_attention), gates and the entropy, per input, head, query and slot."""
    q, k, v, mask, mem, chunks, weights = _random_case(seed=6)
    alpha, scaling = [0.7, 0.3, 0.5], 0.4
    fr = fused_attention(q, k, v, mask, mem, alpha=torch.tensor(alpha), joint=torch.tensor([joint] * 3),
                         scaling=scaling)
    for b in range(3):
        attn_c = fr.slot_attention(b)  # (nh, T, S, hs)
        for h in range(q.shape[1]):
            for i in mask[b].nonzero().flatten().tolist():
                qi = q[b, h, i].double()
                s_in = (k[b, h][mask[b]].double() @ qi) * scaling
                parts = [torch.softmax(s_in, 0)]
                lse_in = torch.logsumexp(s_in, 0)
                lse_c = [torch.logsumexp((kc[h].double() @ qi) * scaling, 0) for kc, _ in chunks[b]]
                total = torch.logsumexp(torch.stack([lse_in] + lse_c), 0) if chunks[b] else lse_in
                g_in = (alpha[b] if chunks[b] else 1.0) if not joint else float(torch.exp(lse_in - total))
                assert fr.gate_in[b, h, i].item() == pytest.approx(g_in, abs=1e-6)
                dist = [g_in * parts[0]]
                for s, ((kc, vc), w) in enumerate(zip(chunks[b], weights[b])):
                    n = kc.shape[1]
                    p_c = torch.softmax((kc[h].double() @ qi) * scaling, 0)
                    g_c = (1 - alpha[b]) * w if not joint else float(torch.exp(lse_c[s] - total))
                    assert fr.gate_mem[b, h, i, s].item() == pytest.approx(g_c, abs=1e-6)
                    assert torch.allclose(fr.p_mem[b, h, i, s, :n].double(), p_c, atol=1e-6)
                    assert fr.p_mem[b, h, i, s, n:].abs().sum().item() == 0.0  # pad tokens: exactly 0
                    assert fr.lse_mem[b, h, i, s].item() == pytest.approx(lse_c[s].item(), abs=1e-5)
                    assert torch.allclose(attn_c[h, i, s].double(), p_c @ vc[h].double(), atol=1e-6)
                    dist.append(g_c * p_c)
                for s in range(len(chunks[b]), mem.token_mask.shape[1]):  # empty slots
                    assert fr.lse_mem[b, h, i, s].item() == -math.inf
                    assert fr.p_mem[b, h, i, s].abs().sum().item() == 0.0
                assert fr.entropy[b, h, i].item() == pytest.approx(entropy(torch.cat(dist)).item(), abs=1e-5)
                assert fr.entropy_in[b, h, i].item() == pytest.approx(entropy(parts[0]).item(), abs=1e-5)
