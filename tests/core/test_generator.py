"""The generator's memory attention against its references (softknn.generate.attention, softknn.generate.model).

(a) fixed with α = 1 generates exactly what the unmodified model generates; (b) joint with memory at
every layer equals the unmodified model on [chunk_1 … chunk_k ; prompt] under a mask in which each
chunk sees only itself (and the shared prefix, where there is one), same position ids; (c) fixed
equals a plain per-head loop of the formula. On randomly initialised Llama, Qwen2 and Mistral
configs (grouped-query and multi-query heads) and on the packaged SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from softknn.generate.attention import ReferenceHook, bind, place_memory, rotate_keys
from softknn.generate.model import Generator, Sampling, TextStream
from tests.numerics import close

CHUNKS = [
    "An adult single on the Amber Line between Harrowmere and Saltbridge costs $9.50.",
    "Children aged 5 to 15 travel at half the adult fare on every line.",
    "The Blue Line crossing from Harrowmere to Brindlewick is our longest route.",
    "Dogs on a lead travel free on the Amber and Coral Lines.",
    "The Lantern Bearer was built in 2009 and carries 240 passengers.",
    "Lost property is kept at Saltbridge terminal for 30 days.",
    "Bicycles cost $3.00 each way on every line.",
    "In a storm warning the Dusk Line does not sail after 18:00.",
]
PROMPTS = ["How much is an adult single on the Amber Line?", "Can my dog come on the ferry?",
           "How long is lost property kept?", "When was the Lantern Bearer built?"]


@pytest.fixture(scope="module")
def smol() -> Generator:
    return Generator.load()


def _tiny(family: str, tokenizer) -> Generator:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  max_position_embeddings=2048, tie_word_embeddings=True)
    if family == "llama":  # grouped-query: 4 query heads share 2 key/value heads
        model = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2))
    elif family == "qwen2":  # q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(**common, num_attention_heads=4, num_key_value_heads=2))
    else:  # multi-query: one key/value head; no sliding window inside these lengths
        model = MistralForCausalLM(MistralConfig(**common, num_attention_heads=4, num_key_value_heads=1,
                                                 sliding_window=None))
    return Generator(model, tokenizer, name=f"tiny-{family}")


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def tiny(request, smol) -> Generator:
    return _tiny(request.param, smol.tokenizer)


def _memory(g: Generator, k: int, positions: str, prefix: list[int] = (), layers=None):
    """R = the first k CHUNKS, encoded as GenEngine does for `exact`: after the prefix; with one and
    reordered placement, each chunk at its placed positions (a stored chunk is encoded right after it)."""
    ids = [g.memory_ids(t) for t in CHUNKS[:k]]
    layers = g.layers(layers)
    starts = None
    if prefix and positions == "reordered":
        starts = [len(prefix) + sum(len(x) for x in ids[:c]) for c in range(k)]
    kv = [torch.from_numpy(x) for x in g.chunk_kv(ids, layers, prefix=list(prefix), starts=starts)]
    w = torch.softmax(torch.linspace(1.0, 0.0, k), 0)
    mem = place_memory(kv, layers, w, positions, g.inv_freq, encoded_after=starts or len(prefix),
                       prefix_len=len(prefix))
    return ids, mem


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


# --- (a) α = 1 is the unmodified model ------------------------------------------------------------
def test_alpha_one_generates_what_the_plain_model_generates(smol):
    q = smol.layout(messages=[{"role": "user", "content": PROMPTS[0]}])
    prompt = q[0] + q[1]
    _, mem = _memory(smol, 4, "composite")
    s = Sampling(max_tokens=6)
    plain = smol.run(prompt, None, sampling=s, keep_logits=True)
    a1 = smol.run(prompt, mem, sampling=s, mixing="fixed", alpha=1.0, keep_logits=True)
    assert a1.token_ids == plain.token_ids and a1.text == plain.text
    assert _max_diff(a1.logits, plain.logits) <= 1e-5
    with torch.inference_mode():  # and the plain path is transformers' own forward and generate, untouched
        ref = smol.model(input_ids=torch.tensor([prompt])).logits[0, -1]
        hf = smol.model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):]
    # logits are unbounded (~20): the cached one-position path and the full forward agree to 1e-5 relative
    assert all(close(float(x), float(y), 1e-5) for x, y in zip(plain.logits[0], ref, strict=True))
    assert [t for t in hf.tolist() if t not in smol.eos_ids][: len(plain.token_ids)] == plain.token_ids


# --- (b) joint = the masked concatenation ------------------------------------------------------------
@pytest.mark.parametrize("positions", ["composite", "reordered"])
def test_joint_equals_the_masked_concatenation_on_tiny_models(tiny, positions):
    for k in (1, 4, 8):
        ids, mem = _memory(tiny, k, positions)
        prompt = tiny.layout(prompt=PROMPTS[k % len(PROMPTS)])[1]
        got = tiny.run(prompt, mem, sampling=Sampling(max_tokens=5), mixing="joint", keep_logits=True)
        ref = tiny.generate_masked_reference(ids, prompt, positions, Sampling(max_tokens=5))
        assert got.token_ids == ref.token_ids
        assert _max_diff(got.logits, ref.logits) <= 1e-4, (tiny.info.name, k)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_joint_equals_the_masked_concatenation_on_smollm2(smol, k):
    """Raw prompts (no prefix: each chunk sees only itself) and chat prompts (the chunks encoded after
    the conversation's head, which the rest of the prompt shares), both placements."""
    for i, question in enumerate(PROMPTS[:2]):
        positions = ("composite", "reordered")[i % 2]
        ids, mem = _memory(smol, k, positions)
        prompt = smol.layout(prompt=question)[1]
        got = smol.run(prompt, mem, sampling=Sampling(max_tokens=4), mixing="joint", keep_logits=True)
        ref = smol.generate_masked_reference(ids, prompt, positions, Sampling(max_tokens=4))
        assert got.token_ids == ref.token_ids
        assert _max_diff(got.logits, ref.logits) <= 1e-4
        prefix, rest = smol.layout(messages=[{"role": "user", "content": question}])
        ids, mem = _memory(smol, k, positions, prefix)
        got = smol.run(prefix + rest, mem, sampling=Sampling(max_tokens=4), mixing="joint", keep_logits=True)
        ref = smol.generate_masked_reference(ids, prefix + rest, positions, Sampling(max_tokens=4), prefix_len=len(prefix))
        assert got.token_ids == ref.token_ids
        assert _max_diff(got.logits, ref.logits) <= 1e-4


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 20 float64 reference generations: ~8 min at load 6 here, past the suite's 600 s at 12
@pytest.mark.parametrize("k", [8])  # the largest R only: k 1 and 4 are in the default suite's smollm2 test
def test_joint_equals_the_masked_concatenation_on_twenty_prompts(smol, k):
    with open("softknn/sample_kb/qa.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f][:20]
    worst = 0.0
    for i, question in enumerate(questions):
        positions = ("composite", "reordered")[i % 2]
        prefix, rest = smol.layout(messages=[{"role": "user", "content": question}])
        ids, mem = _memory(smol, k, positions, prefix)
        got = smol.run(prefix + rest, mem, sampling=Sampling(max_tokens=8), mixing="joint", keep_logits=True)
        ref = smol.generate_masked_reference(ids, prefix + rest, positions, Sampling(max_tokens=8), prefix_len=len(prefix))
        assert got.token_ids == ref.token_ids, question
        worst = max(worst, _max_diff(got.logits, ref.logits))
    assert worst <= 1e-4


# --- (c) fixed = the per-head loop ---------------------------------------------------------------------
def _with_reference(g: Generator, prompt, mem, alpha: float, mixing: str = "fixed", prior: float = 0.0):
    """The fast hook's logits and the float64 loop's, for one forward over the prompt."""
    from softknn.generate.attention import MemoryHook, prompt_positions

    pos = prompt_positions(len(prompt), mem)[None]
    out = []
    for hook in (MemoryHook(mem, mixing=mixing, alpha=alpha, prior=prior),
                 ReferenceHook(mem, mixing=mixing, alpha=alpha, prior=prior)):
        hook.skip_rows = mem.prefix_len
        with bind(hook), torch.inference_mode():
            out.append(g.model(input_ids=torch.tensor([prompt]), position_ids=pos).logits[0])
    return out


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7])
def test_fixed_equals_the_per_head_loop_on_tiny_models(tiny, alpha):
    _, mem = _memory(tiny, 4, "composite")
    fast, ref = _with_reference(tiny, tiny.layout(prompt=PROMPTS[1])[1], mem, alpha)
    assert float((fast - ref).abs().max()) <= 1e-4


@pytest.mark.parametrize("prior", [1.0, 2.0])
def test_joint_with_the_knn_prior_equals_the_per_head_loop_on_tiny_models(tiny, prior):
    _, mem = _memory(tiny, 4, "composite")
    fast, ref = _with_reference(tiny, tiny.layout(prompt=PROMPTS[2])[1], mem, 0.7, "joint", prior)
    assert float((fast - ref).abs().max()) <= 1e-4


def test_the_knn_prior_moves_the_mass_by_w_db_and_is_void_for_uniform_weights(smol):
    from softknn.generate.attention import MemoryHook

    prefix, rest = smol.layout(messages=[{"role": "user", "content": PROMPTS[0]}])
    _, mem = _memory(smol, 4, "composite", prefix)  # w_db decreasing over the 4 chunks
    s = Sampling(max_tokens=2)
    plain = smol.run(prefix + rest, mem, sampling=s, mixing="joint", keep_logits=True)
    with_prior = smol.run(prefix + rest, mem, sampling=s, mixing="joint", prior=2.0, keep_logits=True)
    # g_c ∝ (k·w_db(c))^β·Z_c: the share ratio to the plain joint's moves by exactly (k·w_db(c))^β / norm
    ratio = with_prior.trace.share[0] / plain.trace.share[0]  # per-layer means, so compare the ordering
    assert ratio.argsort().tolist() == torch.argsort(mem.weight).tolist()
    uniform = type(mem)(mem.layers, mem.token_mask, torch.full((4,), 0.25), mem.lengths, mem.prompt_start, mem.prefix_len)
    a = smol.run(prefix + rest, uniform, sampling=s, mixing="joint", keep_logits=True)
    b = smol.run(prefix + rest, uniform, sampling=s, mixing="joint", prior=4.0, keep_logits=True)
    assert _max_diff(a.logits, b.logits) <= 1e-6 and a.token_ids == b.token_ids
    with pytest.raises(ValueError, match="prior"):
        MemoryHook(mem, mixing="joint", alpha=0.7, prior=-1.0)


def test_fixed_and_joint_equal_the_per_head_loop_on_smollm2(smol):
    prefix, rest = smol.layout(messages=[{"role": "user", "content": "Bikes?"}])
    _, mem = _memory(smol, 2, "reordered", prefix, layers="27,28,29")  # the loop is slow: three memory layers
    for mixing in ("fixed", "joint"):
        fast, ref = _with_reference(smol, prefix + rest, mem, 0.6, mixing)
        assert float((fast - ref).abs().max()) <= 1e-4, mixing


def test_fixed_mixing_changes_the_answer_and_weights_chunks_by_w_db(smol):
    prefix, rest = smol.layout(messages=[{"role": "user", "content": PROMPTS[0]}])
    _, mem = _memory(smol, 4, "composite", prefix)
    s = Sampling(max_tokens=3)
    plain = smol.run(prefix + rest, None, sampling=s, keep_logits=True)
    mixed = smol.run(prefix + rest, mem, sampling=s, mixing="fixed", alpha=0.5, keep_logits=True)
    assert float((mixed.logits[0] - plain.logits[0]).abs().max()) > 1e-2  # the memory is read
    for m in mixed.trace.mass:  # (1 − α)·w_db(c), the same for every generated token
        assert torch.allclose(m, 0.5 * mem.weight, atol=1e-6)


# --- placement -------------------------------------------------------------------------------------------
def test_rotating_stored_keys_equals_encoding_at_the_later_positions(smol):
    ids = [smol.memory_ids(CHUNKS[0])]
    pad = smol.memory_ids("Context:\n")  # any 3+ tokens: the chunk encoded after them sits at +len(pad)
    layers = [0, 15, 29]
    at0 = torch.from_numpy(smol.chunk_kv(ids, layers)[0])  # (n, L, 2, nkv, hs)
    k0 = at0[:, :, 0].permute(1, 2, 0, 3)  # (L, nkv, n, hs)
    moved = rotate_keys(k0, 7, smol.inv_freq)
    # the same chunk at positions 7..7+n−1 on its own: encode after 7 tokens whose keys it does not see
    from transformers import DynamicCache

    cache = DynamicCache(config=smol.model.config)
    with torch.inference_mode():
        smol.model.model(input_ids=torch.tensor(ids), position_ids=7 + torch.arange(len(ids[0]))[None],
                         **{smol.cache_kw: cache}, use_cache=True)
    direct = torch.stack([cache.layers[layer].keys[0] for layer in layers])  # (L, nkv, n, hs)
    assert float((moved - direct).abs().max()) <= 1e-4
    assert len(pad) >= 3


def test_layers_are_named_as_given_and_checked(smol):
    assert smol.layers("all") == list(range(30))
    assert smol.layers("-1,0,5") == [0, 5, 29]
    with pytest.raises(Exception, match="memory layers"):
        smol.layers("30")


def test_the_packaged_model_is_smollm2_with_grouped_query_heads(smol):
    i = smol.info
    assert (i.family, i.num_layers, i.num_heads, i.num_kv_heads, i.head_dim) == ("llama", 30, 9, 3, 64)
    assert i.name == "smollm2-135m-instruct" and len(i.fingerprint) == 64


def test_score_is_the_mean_nll_of_the_continuation(smol):
    prompt, cont = smol.layout(prompt="The ferry to Saltbridge costs")[1], smol.memory_ids(" $9.50")[:3]
    with torch.inference_mode():
        logits = smol.model(input_ids=torch.tensor([prompt + cont])).logits[0]
    lp = torch.log_softmax(logits.double(), -1)
    want = -np.mean([float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)])
    assert smol.score(prompt, cont) == pytest.approx(want, abs=1e-4)


def test_a_selected_chunk_spans_its_whole_length_so_the_prompt_starts_after_it():
    """Token selection keeps each kept token's own position: a chunk of 10 tokens stored as 4 still
    spans 10 positions, so the prompt starts at P + 10 (composite) and the next chunk of a
    reordered placement at P + 10, never among the kept keys (the bug: P + 4, the query in the past
    of keys it attends to)."""
    L, nkv, hs, P = 2, 1, 4, 3
    a, b = torch.randn(4, L, 2, nkv, hs), torch.randn(6, L, 2, nkv, hs)
    inv = 1.0 / (10000 ** (torch.arange(0, hs, 2).float() / hs))
    w = torch.tensor([0.5, 0.5])
    comp = place_memory([a, b], [0, 1], w, "composite", inv, encoded_after=P, prefix_len=P, extents=[10, 6])
    assert comp.prompt_start == P + 10
    assert place_memory([a, b], [0, 1], w, "composite", inv, encoded_after=P, prefix_len=P).prompt_start == P + 6
    re = place_memory([a, b], [0, 1], w, "reordered", inv, encoded_after=P, prefix_len=P, extents=[10, 6])
    assert re.prompt_start == P + 16
    # the second chunk moved by the first's whole span: its keys rotated by 10 positions, not 4
    want = rotate_keys(b[:, :, 0].permute(1, 2, 0, 3), 10, inv)
    assert torch.allclose(re.layers[0].key[:, 1, :6], want[0], atol=1e-6)


STREAMED = ["注意力就是软最近邻：每个查询按相似度加权。 — café, naïve 🙂🙂 done.",
            "The ferry leaves the harbour at nine; dogs on a lead travel free. " * 4 + "  spaces ,  . ! ?",
            "数据库 lacks the answer → «refuse» ✓ 🚢⛴ end"]


@pytest.mark.parametrize("text", STREAMED, ids=["chinese", "english", "mixed"])
def test_streamed_pieces_join_to_the_tokens_text_and_never_cut_a_character(smol, text):
    """Token by token, the text out is the decode of every token so far, less a character whose bytes are
    not all in yet (which comes whole with the token that completes it): the pieces join to the whole
    decode and none holds U+FFFD. The old stream, which decoded everything each token and sent what
    followed the last text, sent '����是�最��' for the Chinese line. The window stays short: the
    decode each token runs reads WINDOW + 1 tokens at most, and the tokens of characters still cut
    besides (a few), not the whole answer."""
    ids = smol._ids(text)
    ts = TextStream(smol.tokenizer, set(), ())
    lengths: list[int] = []
    real = ts._decode
    ts._decode = lambda x: lengths.append(len(x)) or real(x)  # type: ignore[method-assign]
    pieces = []
    for i, tok in enumerate(ids):
        step = ts.add(tok)
        assert step is not None and step.token_id == tok
        pieces.append(step.text)
        whole = smol.tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        assert ts.text == whole or (whole.endswith("\ufffd") and whole.startswith(ts.text))
    assert max(lengths) <= 2 * TextStream.WINDOW < len(ids)
    assert "".join(pieces) == ts.text == smol.tokenizer.decode(ids, skip_special_tokens=True) == ts.text_reference()
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("stop", ["travel", "; dogs", "e h", "🙂🙂", "软最近", "not in it"])
def test_a_stop_string_ends_the_stream_at_the_token_that_completes_it_and_cuts_before_it(smol, stop):
    """Against the whole decode after each token: the stream finishes at the first token whose text holds
    the stop string (across a token boundary too), and its text is the decode cut before it."""
    ids = smol._ids(STREAMED[0] + " " + STREAMED[1])
    ts = TextStream(smol.tokenizer, set(), (stop,))
    n = 0
    while not ts.finished and n < len(ids):
        ts.add(ids[n])
        n += 1
    texts = [smol.tokenizer.decode(ids[: i + 1], skip_special_tokens=True) for i in range(len(ids))]
    first = next((i + 1 for i, t in enumerate(texts) if stop in t), None)
    if first is None:
        assert not ts.finished and ts.text == texts[-1]
    else:
        assert ts.finished and n == first and ts.text == texts[first - 1][: texts[first - 1].find(stop)]
