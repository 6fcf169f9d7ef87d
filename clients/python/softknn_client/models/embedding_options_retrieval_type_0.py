from typing import Literal

EmbeddingOptionsRetrievalType0 = Literal["dense", "hybrid", "lexical"]

EMBEDDING_OPTIONS_RETRIEVAL_TYPE_0_VALUES: set[EmbeddingOptionsRetrievalType0] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_embedding_options_retrieval_type_0(value: str) -> EmbeddingOptionsRetrievalType0:
    if value in EMBEDDING_OPTIONS_RETRIEVAL_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {EMBEDDING_OPTIONS_RETRIEVAL_TYPE_0_VALUES!r}")
