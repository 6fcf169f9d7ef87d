from typing import Literal

EmbeddingOptionsKernel = Literal["epanechnikov", "softmax", "uniform"]

EMBEDDING_OPTIONS_KERNEL_VALUES: set[EmbeddingOptionsKernel] = {
    "epanechnikov",
    "softmax",
    "uniform",
}


def check_embedding_options_kernel(value: str) -> EmbeddingOptionsKernel:
    if value in EMBEDDING_OPTIONS_KERNEL_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {EMBEDDING_OPTIONS_KERNEL_VALUES!r}")
