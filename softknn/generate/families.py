"""What a Llama-family generator may differ in, and what softknn takes: one place that says yes or no,
read by the torch path (softknn.generate.model.Generator) and the decode graph (softknn.generate.graph).

- **RoPE.** The memory stores keys after RoPE (softknn.generate.attention), so a model's rotary
  frequencies must be fixed: `default`, `linear`, `llama3` and `yarn` are (transformers bakes them into
  `rotary_emb.inv_freq` at load; YaRN also multiplies cos/sin by `attention_scaling`, which leaves RoPE
  relative: s·R(p + o) = R(o)·s·R(p)). `dynamic` and `longrope` recompute the frequencies from the
  length of each forward, so a key stored at one length is read by queries rotated under another's.
- **Sliding windows** (Mistral, Qwen2 with use_sliding_window): below the window W no query is W
  positions from any key, so full attention is the model's attention; `max_positions` caps a request's
  positions at W.
- **GGUF files**: transformers' GGUF loader reads no RoPE scaling for llama / qwen2 / mistral files
  (neither `{arch}.rope.scaling.*` nor the llama3 factors llama.cpp writes as `rope_freqs.weight`), so
  such a file would load as another model: `check_gguf` refuses it.
"""

from __future__ import annotations

from pathlib import Path

from softknn.common.errors import UnsupportedModel

FAMILIES = ("llama", "qwen2", "mistral")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed at load
ROPE_POSITION_DEPENDENT = ("dynamic", "longrope")  # frequencies recomputed from each forward's length


def rope_type(config) -> str:
    """The config's RoPE variant (transformers 5's rope_parameters, or 4's rope_scaling)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(rope.get("rope_type") or rope.get("type") or "default")


def check_rope(config, who: str) -> None:
    """UnsupportedModel, naming `who` and the type, unless the RoPE frequencies are fixed (ROPE_TYPES)."""
    kind = rope_type(config)
    if kind in ROPE_POSITION_DEPENDENT:
        raise UnsupportedModel(f"{who}: rope type {kind!r} recomputes its frequencies from the sequence length, "
                               f"so stored keys would not match the queries; supported: {', '.join(ROPE_TYPES)}")
    if kind not in ROPE_TYPES:
        raise UnsupportedModel(f"{who}: rope type {kind!r}; supported: {', '.join(ROPE_TYPES)}")


def sliding_window(config) -> int | None:
    """The window W of the layers that slide (a query sees the keys fewer than W positions back), or
    None where every layer sees its whole past (no window, use_sliding_window false, or no sliding
    layer in layer_types)."""
    w = getattr(config, "sliding_window", None)
    if not w or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return int(w)


def max_positions(config) -> int:
    """The positions a request may reach: max_position_embeddings, or the sliding window if smaller
    (where the window never bites)."""
    window = sliding_window(config)
    n = int(config.max_position_embeddings)
    return min(n, window) if window else n


def check_gguf(path: Path) -> None:
    """UnsupportedModel if the GGUF file states a RoPE scaling that transformers' loader would drop (asked
    before a conversion: reading the header parses the whole vocabulary, seconds for a large one)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{arch}.rope.scaling.type")
    kind = field.contents() if field is not None else "none"
    if kind != "none":
        raise UnsupportedModel(f"{path}: RoPE scaling {kind!r} ({arch}.rope.scaling.type), which transformers' "
                               "GGUF loader drops: it would run another model; use the model's transformers "
                               "folder (config.json and safetensors)")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedModel(f"{path}: RoPE frequency factors (rope_freqs.weight, Llama 3's rope scaling), which "
                               "transformers' GGUF loader drops: it would run another model; use the model's "
                               "transformers folder (config.json and safetensors)")
