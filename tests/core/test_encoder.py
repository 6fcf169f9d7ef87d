"""The encoder: packaged model, tokenization with offsets, masking, fused pass resume vs. full rerun."""

import numpy as np
import pytest
import torch

from softknn.common.errors import InputTooLarge
from softknn.model.encoder import weight_fingerprint

TEXTS = ["hello world", "a much longer sentence here, to make the first one pad", "Ferry to Saltbridge?"]


def test_default_model_is_the_packaged_minilm(encoder):
    assert encoder.info.name == "all-MiniLM-L6-v2"
    assert encoder.info.max_seq_length == 256
    assert (encoder.info.num_layers, encoder.info.num_heads, encoder.info.head_dim, encoder.info.dim) == (6, 12, 32, 384)


def test_tokenizer_pads_to_the_longest_input_not_a_fixed_length(encoder):
    b = encoder.tokenize(TEXTS)
    assert b.features["input_ids"].shape[1] == max(b.n_tokens) < 32
    assert b.n_tokens[0] == 4  # [CLS] hello world [SEP]


def test_offsets_map_every_token_back_to_its_text(encoder):
    b = encoder.tokenize(TEXTS)
    for i, text in enumerate(TEXTS):
        ids = b.features["input_ids"][i, : b.n_tokens[i]].tolist()
        pieces = encoder.tokenizer.convert_ids_to_tokens(ids)
        for t, (piece, (s, e)) in enumerate(zip(pieces, b.offsets[i].tolist())):
            if b.special[i, t]:
                assert piece in ("[CLS]", "[SEP]")
            else:
                assert text[s:e].lower() == piece.removeprefix("##")


def test_plain_pass_equals_sentence_transformers_and_padding_is_masked(encoder):
    batch = encoder.forward_plain(encoder.tokenize(TEXTS)).embedding.numpy()
    st = encoder.st.encode(TEXTS, convert_to_numpy=True)
    assert np.abs(batch - st).max() <= 1e-6
    for i, text in enumerate(TEXTS):  # each input alone, no padding at all
        solo = encoder.forward_plain(encoder.tokenize([text])).embedding.numpy()[0]
        assert np.abs(batch[i] - solo).max() <= 1e-5


def test_custom_attention_without_a_mask_function_would_leak_padding(encoder):
    """Why softknn registers a mask function: with the mask dropped, the padded input changes."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    batch = encoder.tokenize(TEXTS)
    good = encoder.forward_plain(batch).embedding
    AttentionMaskInterface._global_mapping.pop("softknn")
    try:
        leaky = encoder.forward_plain(batch).embedding
    finally:
        AttentionMaskInterface.register("softknn", sdpa_mask)
    assert (leaky[0] - good[0]).abs().max() > 1e-3  # the padded input is corrupted...
    assert (leaky[1] - good[1]).abs().max() <= 1e-5  # ...the longest one is not


@pytest.mark.parametrize("layer", [0, 3, 5])
def test_resume_from_layer_equals_full_rerun(encoder, layer):
    batch = encoder.tokenize(TEXTS)
    plain = encoder.forward_plain(batch, keep_hidden=True)

    def fuse(q, k, v, scaling):  # a non-trivial replacement: half the attention output
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=batch.mask[:, None, None, :], scale=scaling)
        return 0.5 * out

    fast, _ = encoder.forward_fused(batch, layer, fuse, plain)
    full, _ = encoder.forward_fused(batch, layer, fuse, plain, resume=False)
    assert (fast - full).abs().max() <= 1e-6
    assert (fast - plain.embedding).abs().max() > 1e-3  # the replacement did act


@pytest.mark.parametrize("layer", [0, 3, 5])
def test_resume_reusing_the_plain_pass_qkv_equals_recomputing_them(encoder, layer):
    """With the plain pass's q, k, v at the memory layer, the fused pass skips that layer's Q/K/V
    projections; the answer must be what recomputing them (and a full rerun) gives."""
    batch = encoder.tokenize(TEXTS)
    plain = encoder.forward_plain(batch, keep_hidden=True)
    kept = encoder.forward_plain(batch, keep_hidden=True, capture_layer=layer)
    assert kept.query is not None and kept.capture_layer == layer
    seen = []

    def fuse(q, k, v, scaling):
        seen.append((q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=batch.mask[:, None, None, :], scale=scaling)
        return 0.5 * out

    reused, _ = encoder.forward_fused(batch, layer, fuse, kept)
    recomputed, _ = encoder.forward_fused(batch, layer, fuse, plain)
    full, _ = encoder.forward_fused(batch, layer, fuse, plain, resume=False)
    assert seen[0][0] is kept.query and seen[0][1] is kept.key  # really reused, not recomputed
    assert torch.equal(seen[0][0], seen[1][0]) and torch.equal(seen[0][2], seen[1][2])
    assert (reused - recomputed).abs().max() <= 1e-6
    assert (reused - full).abs().max() <= 1e-6
    assert (reused - plain.embedding).abs().max() > 1e-3


def test_capture_returns_the_layers_keys_and_values(encoder):
    batch = encoder.tokenize(TEXTS[:1])
    p = encoder.forward_plain(batch, capture_layer=2, keep_hidden=True)
    attn = encoder.model.encoder.layer[2].attention.self
    h = p.hidden_states[2]  # (1, T, C): layer 2's input
    with torch.inference_mode():
        k = attn.key(h).view(1, -1, 12, 32).transpose(1, 2)
    assert torch.allclose(p.key, k, atol=1e-6)


def test_too_long_input_is_refused_unless_truncation_is_asked_for(encoder):
    long = "ferry " * 400
    with pytest.raises(InputTooLarge, match="truncate"):
        encoder.tokenize([long], truncate=False)
    b = encoder.tokenize(["short", long], truncate=[False, True])
    assert b.truncated == [False, True]
    assert b.n_tokens[1] == 256


def test_one_pass_tokenize_equals_the_two_pass_form(encoder):
    """tokenize tokenizes once, untruncated, and again only when an input is over the limit;
    the answer must be what counting first and then tokenizing cut would give."""
    long = "ferry timetable " * 200  # ≈ 400 tokens
    for texts, limit in ((["short one", "a slightly longer question about ferries?"], 256),
                         (["short one", long, "mid length text about the harbour"], 256),
                         (["short one", long], 32)):
        batch = encoder.tokenize(texts, truncate=True, max_tokens=limit)
        counted = [len(ids) for ids in encoder.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        ref = encoder.tokenizer(texts, padding="longest", truncation=True, max_length=limit,
                                return_offsets_mapping=True, return_tensors="pt")
        assert torch.equal(batch.features["input_ids"], ref["input_ids"])
        assert torch.equal(batch.features["attention_mask"], ref["attention_mask"])
        assert torch.equal(batch.offsets, ref["offset_mapping"])
        assert batch.truncated == [n > limit for n in counted]
        assert batch.n_tokens == [min(n, limit) for n in counted]


def test_fingerprint_changes_with_any_weight():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    fp = weight_fingerprint(lin)
    assert fp == weight_fingerprint(lin)
    with torch.no_grad():
        lin.bias[0] += 1e-6
    assert weight_fingerprint(lin) != fp
