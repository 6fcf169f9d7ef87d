"""The generator a user brings (`--generator PATH`, softknn.generate.model.Generator.load): a tiny randomly
initialised model of each Llama family, written to disk by the test itself — a transformers folder
(config.json, safetensors, tokenizer) or a GGUF file as llama.cpp lays it out — loaded through the
user's door, and decoded by the graph (softknn.generate.graph) against torch with the memory hook: the
same greedy tokens, logits within 1e-4 (relative above 1), without memory and with R in both placements.
What neither path can run exactly is refused by name (softknn.generate.families).

The tokenizer is a byte-level BPE trained here on the test's own text (no download): 3 special tokens,
a ChatML template, and Qwen2's pre-tokenizer, which transformers imposes on any qwen2 folder's tokenizer
(the others keep their tokenizer.json's), so every family tokenises alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from softknn.common.errors import InvalidInput, UnsupportedModel
from softknn.generate.batch import DecodeLoop, job_for
from softknn.generate.graph import check_supported, decoder_shape, rope_tables
from softknn.generate.model import Generator, Sampling
from softknn.generate.runtime import DecoderSession
from tests.core.test_decode_graph import _all_close, _gen
from tests.core.test_generator import CHUNKS, PROMPTS, _memory

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# name → (family, query heads, key/value heads, tied output embeddings)
ARCHS = {
    "llama-gqa": ("llama", 4, 2, False),  # 2 query heads per key/value head, its own output matrix
    "qwen2-biases": ("qwen2", 6, 2, True),  # q/k/v biases, 3 query heads per key/value head, tied (Qwen2-0.5B)
    "mistral-mqa": ("mistral", 4, 1, False),  # multi-query: one key/value head
    "smollm-mha": ("llama", 4, 4, True),  # multi-head: nkv = nh, tied (SmolLM2)
}
MEMORY_LAYERS = [1, 2]  # layer 0 without memory: the graph's bias_plain path too
ROPE = {  # fixed frequencies (softknn.generate.families.ROPE_TYPES); llama3 spans its three bands at hs 16
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "attention_factor": 1.0},
}
YARN_SCALED = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}  # cos/sin × 1.1386


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CHUNKS + PROMPTS + ["Context:\nQuestion: user assistant"], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=SPECIAL[1], eos_token=SPECIAL[2],
                                  unk_token=SPECIAL[0], pad_token=SPECIAL[2])
    tok.chat_template = CHATML
    return tok


def _model(arch: str, tokenizer, **config):
    """A random fp32 model of ARCHS[arch]: 3 layers, head dim 16, 2048 positions; `config` overrides."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    family, nh, nkv, tied = ARCHS[arch]
    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config),
                    "mistral": (MistralForCausalLM, MistralConfig)}[family]
    kw = dict(vocab_size=len(tokenizer), hidden_size=16 * nh, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=2048,
              tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if family == "mistral":
        kw["sliding_window"] = None
    torch.manual_seed(0)
    return cls(cfg_cls(**(kw | config))).eval()


def _write_folder(model, tokenizer, out: Path) -> Path:
    """What a user's transformers folder holds: config.json, model.safetensors, the tokenizer."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for the llama architecture (convert_hf_to_gguf's `permute`): each head's
    rotate-half pairs interleaved; transformers' GGUF loader undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _write_gguf(model, tokenizer, out: Path, rope_scaling: str | None = None, rope_freqs: bool = False) -> Path:
    """The model as a float32 GGUF file, laid out as llama.cpp's converter writes it: llama.cpp's
    architecture name (Mistral's is `llama`), metadata keys, tensor names, q/k rows permuted for `llama`,
    no output.weight when tied, and the tokenizer as `gpt2` BPE with Qwen2's pre-tokenizer (tokens in
    the byte alphabet, merges, token types, special ids, the chat template)."""
    from gguf import GGUFWriter, RopeScalingType, TokenType

    cfg, family = model.config, model.config.model_type
    arch = "qwen2" if family == "qwen2" else "llama"
    out.mkdir(parents=True)
    path = out / "model.gguf"
    w = GGUFWriter(path, arch)
    w.add_name(f"Tiny {family.capitalize()}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(0)  # all float32
    if rope_scaling is not None:
        w.add_rope_scaling_type(RopeScalingType(rope_scaling))
        w.add_rope_scaling_factor(4.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    w.add_token_types([TokenType.CONTROL if i < len(SPECIAL) else TokenType.NORMAL for i in range(len(tokenizer))])
    w.add_token_merges([" ".join(m) for m in json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    if rope_freqs:  # what llama.cpp writes for Llama 3's rope scaling
        w.add_tensor("rope_freqs.weight", np.ones(cfg.hidden_size // cfg.num_attention_heads // 2, dtype=np.float32))
    heads = {"self_attn.q_proj": cfg.num_attention_heads, "self_attn.k_proj": cfg.num_key_value_heads}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in _GGUF_NAMES.items():
            for kind in ("weight", "bias"):
                t = sd.get(f"model.layers.{i}.{hf}.{kind}")
                if t is None:
                    continue
                if arch == "llama" and hf in heads:
                    t = _permute(t, heads[hf])
                w.add_tensor(f"blk.{i}.{gg}.{kind}", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _loads_as_written(g: Generator, model, tokenizer, family: str | None = None) -> None:
    """The door read back exactly the numbers and the tokenizer that were written, as `family` (default
    the model's own)."""
    want, got = model.state_dict(), g.model.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert g.info.family == (family or model.config.model_type)
    assert (g.info.num_heads, g.info.num_kv_heads) == (model.config.num_attention_heads, model.config.num_key_value_heads)
    assert g.model.config.tie_word_embeddings == model.config.tie_word_embeddings
    for text in CHUNKS[:4] + PROMPTS:
        assert g.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert g.eos_ids == {2}


def _graph_matches_torch(g: Generator, k: int = 4, placements=(None, "composite", "reordered")) -> None:
    """Chat prompts decoded by the graph (fp32 weights) and by torch with the memory hook (joint): no
    memory, then R = the first k CHUNKS in each placement; the same greedy tokens, logits within 1e-4."""
    loop = DecodeLoop(DecoderSession(g.model, "fp32", MEMORY_LAYERS), g.eos_ids, g.tokenizer)
    try:
        for i, positions in enumerate(placements):
            prefix, rest = g.layout(messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
            mem = None if positions is None else _memory(g, k, positions, prefix, layers=MEMORY_LAYERS)[1]
            s = Sampling(max_tokens=6)
            got = _gen(loop.submit(job_for(prefix + rest, mem, s, keep_logits=True)))
            ref = g.run(prefix + rest, mem, sampling=s, mixing="joint", keep_logits=True)
            assert got.token_ids == ref.token_ids, (g.info.name, positions)
            assert _all_close(got.logits, ref.logits), (g.info.name, positions)
            assert len(ref.logits) == 6  # no early EOS (seeded models): every step compared
    finally:
        loop.close()


# --- the families, through the user's door ------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_transformers_folder_of_each_family_decodes_in_the_graph_as_in_torch(arch, tokenizer, tmp_path):
    model = _model(arch, tokenizer)
    g = Generator.load(str(_write_folder(model, tokenizer, tmp_path / arch)))
    _loads_as_written(g, model, tokenizer)
    assert g.info.name == arch
    _graph_matches_torch(g)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_gguf_file_of_each_family_decodes_in_the_graph_as_in_torch(arch, tokenizer, tmp_path):
    model = _model(arch, tokenizer)
    path = _write_gguf(model, tokenizer, tmp_path / arch)
    g = Generator.load(str(path), cache_dir=tmp_path / "cache")  # converted once into the cache
    # llama.cpp writes Mistral as `llama` and transformers reads it back as Llama: the same layers
    _loads_as_written(g, model, tokenizer, "llama" if arch == "mistral-mqa" else None)
    assert g.info.name == "model.gguf" and Path(g.info.path).parent == tmp_path / "cache"
    _graph_matches_torch(g, placements=(None, "reordered"))


@pytest.mark.parametrize(("scaling", "rope_freqs", "what"), [
    ("linear", False, "RoPE scaling 'linear' (llama.rope.scaling.type)"),
    ("yarn", False, "RoPE scaling 'yarn' (llama.rope.scaling.type)"),
    (None, True, "RoPE frequency factors (rope_freqs.weight, Llama 3's rope scaling)"),
])
def test_a_gguf_file_whose_rope_scaling_transformers_would_drop_is_refused(scaling, rope_freqs, what, tokenizer,
                                                                         tmp_path):
    path = _write_gguf(_model("llama-gqa", tokenizer), tokenizer, tmp_path / "m", scaling, rope_freqs)
    with pytest.raises(UnsupportedModel) as e:
        Generator.load(str(path), cache_dir=tmp_path / "cache")
    assert str(e.value) == (f"{path}: {what}, which transformers' GGUF loader drops: it would run another model; "
                            "use the model's transformers folder (config.json and safetensors)")
    assert not (tmp_path / "cache").exists()


# --- RoPE scaling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ROPE))
def test_rope_scaling_of_fixed_frequencies_decodes_in_the_graph_as_in_torch(kind, tokenizer, tmp_path):
    model = _model("llama-gqa", tokenizer, rope_parameters={**ROPE[kind], "rope_theta": 10000.0})
    plain = _model("llama-gqa", tokenizer).model.rotary_emb.inv_freq
    assert not torch.allclose(model.model.rotary_emb.inv_freq, plain)  # the scaling is in the frequencies
    g = Generator.load(str(_write_folder(model, tokenizer, tmp_path / kind)))
    assert torch.equal(g.inv_freq, model.model.rotary_emb.inv_freq)
    _graph_matches_torch(g)


@pytest.mark.parametrize("kind", [*ROPE, "yarn-scaled"])
def test_reordered_memory_rotated_by_inv_freq_equals_the_masked_concatenation_under_rope_scaling(kind, tokenizer):
    """The torch path moves stored keys by rotate_keys(offset, gen.inv_freq): exact for every fixed-frequency
    RoPE, YaRN's cos/sin factor included (the stored key carries it; the offset's rotation is unscaled)."""
    rope = YARN_SCALED if kind == "yarn-scaled" else ROPE[kind]
    g = Generator(_model("llama-gqa", tokenizer, rope_parameters={**rope, "rope_theta": 10000.0}), tokenizer,
                  name=kind)
    assert (g.model.model.rotary_emb.attention_scaling > 1.1) == (kind == "yarn-scaled")
    for k in (2, 4):
        ids, mem = _memory(g, k, "reordered")
        prompt = g.layout(prompt=PROMPTS[k % len(PROMPTS)])[1]
        got = g.run(prompt, mem, sampling=Sampling(max_tokens=5), mixing="joint", keep_logits=True)
        ref = g.generate_masked_reference(ids, prompt, "reordered", Sampling(max_tokens=5))
        assert got.token_ids == ref.token_ids
        assert _all_close(got.logits, ref.logits), (kind, k)


def test_rope_tables_times_yarns_attention_factor_are_transformers_cos_and_sin(tokenizer):
    rotary = _model("llama-gqa", tokenizer, rope_parameters={**YARN_SCALED, "rope_theta": 10000.0}).model.rotary_emb
    assert rotary.attention_scaling == pytest.approx(0.1 * np.log(4.0) + 1.0)
    cos, sin = rope_tables(rotary.inv_freq, 600, rotary.attention_scaling)  # (600, 8)
    with torch.inference_mode():
        c, s = rotary(torch.zeros(1), torch.arange(600)[None])  # (1, 600, 16): each half the same
    assert np.allclose(cos, c[0, :, :8].numpy(), atol=1e-6) and np.allclose(sin, s[0, :, :8].numpy(), atol=1e-6)
    assert np.allclose(cos, c[0, :, 8:].numpy(), atol=1e-6)


def test_yarns_attention_factor_decodes_in_the_graph_as_in_torch(tokenizer, tmp_path):
    model = _model("llama-gqa", tokenizer, rope_parameters={**YARN_SCALED, "rope_theta": 10000.0})
    assert model.model.rotary_emb.attention_scaling > 1.1
    _graph_matches_torch(Generator.load(str(_write_folder(model, tokenizer, tmp_path / "yarn"))))


def test_heads_times_head_dim_other_than_the_hidden_size_decodes_in_the_graph_as_in_torch(tokenizer, tmp_path):
    model = _model("llama-gqa", tokenizer, head_dim=32)  # 4 heads of 32 on a hidden size of 64 (Mistral-Nemo's shape)
    assert model.config.num_attention_heads * model.config.head_dim != model.config.hidden_size
    _graph_matches_torch(Generator.load(str(_write_folder(model, tokenizer, tmp_path / "wide"))))


@pytest.mark.parametrize(("kind", "rope"), [
    ("dynamic", {"rope_type": "dynamic", "factor": 2.0}),
    ("longrope", {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                  "original_max_position_embeddings": 512}),
])
def test_rope_whose_frequencies_follow_the_sequence_length_is_refused_by_name(kind, rope, tokenizer, tmp_path):
    model = _model("llama-gqa", tokenizer, rope_parameters={**rope, "rope_theta": 10000.0})
    why = (f"rope type {kind!r} recomputes its frequencies from the sequence length, so stored keys would not "
           "match the queries; supported: default, linear, llama3, yarn")
    with pytest.raises(UnsupportedModel) as e:
        Generator.load(str(_write_folder(model, tokenizer, tmp_path / kind)))
    assert str(e.value) == f"{kind}: {why}"
    with pytest.raises(UnsupportedModel) as e:
        check_supported(model)
    assert str(e.value) == f"decode graph: {why}"


# --- what else the families differ in ---------------------------------------------------------------------
def test_a_sliding_window_caps_the_positions_and_within_them_the_graph_is_the_model(tokenizer, tmp_path):
    """Mistral's window W = 128 < 2048 positions: below W no query is W positions from any key, so both
    paths serve requests up to W (the graph with full attention equals torch's windowed mask there) and
    refuse one that would reach past it."""
    model = _model("mistral-mqa", tokenizer, sliding_window=128)
    g = Generator.load(str(_write_folder(model, tokenizer, tmp_path / "mistral")))
    assert decoder_shape(g.model.config).max_positions == 128 and g.max_positions == 128
    _graph_matches_torch(g, k=2, placements=(None, "composite"))
    prompt = sum(g.layout(messages=[{"role": "user", "content": PROMPTS[0]}]), [])
    s = Sampling(max_tokens=128 - len(prompt) + 1)  # the last token fed at position 127, its successor's at 128
    want = "prompt and max_tokens reach position 128; the generator has 128"
    loop = DecodeLoop(DecoderSession(g.model, "fp32", MEMORY_LAYERS), g.eos_ids, g.tokenizer)
    try:
        with pytest.raises(InvalidInput) as e:
            loop.submit(job_for(prompt, None, s))
        assert str(e.value) == want and e.value.field == "max_tokens"
    finally:
        loop.close()
    with pytest.raises(InvalidInput) as e:
        g.run(prompt, None, sampling=s)
    assert str(e.value) == want and e.value.field == "max_tokens"


def test_qwen2_without_use_sliding_window_keeps_every_position(tokenizer):
    model = _model("qwen2-biases", tokenizer, sliding_window=128, use_sliding_window=False)
    assert decoder_shape(model.config).max_positions == 2048


@pytest.mark.parametrize(("config", "what"), [
    ({"attention_bias": True}, "an output-projection bias (attention_bias)"),
    ({"mlp_bias": True}, "MLP biases"),
])
def test_the_graph_refuses_what_its_layers_do_not_compute_by_name(config, what, tokenizer):
    model = _model("llama-gqa", tokenizer, **config)
    Generator(model, tokenizer, name="odd")  # torch runs it
    with pytest.raises(UnsupportedModel) as e:
        check_supported(model)
    assert str(e.value) == f"decode graph: {what}"
