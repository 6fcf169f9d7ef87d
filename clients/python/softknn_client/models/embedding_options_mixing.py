from typing import Literal

EmbeddingOptionsMixing = Literal["fixed", "joint"]

EMBEDDING_OPTIONS_MIXING_VALUES: set[EmbeddingOptionsMixing] = {
    "fixed",
    "joint",
}


def check_embedding_options_mixing(value: str) -> EmbeddingOptionsMixing:
    if value in EMBEDDING_OPTIONS_MIXING_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {EMBEDDING_OPTIONS_MIXING_VALUES!r}")
