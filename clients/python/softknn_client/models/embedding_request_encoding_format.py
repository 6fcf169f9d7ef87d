from typing import Literal

EmbeddingRequestEncodingFormat = Literal["base64", "float"]

EMBEDDING_REQUEST_ENCODING_FORMAT_VALUES: set[EmbeddingRequestEncodingFormat] = {
    "base64",
    "float",
}


def check_embedding_request_encoding_format(value: str) -> EmbeddingRequestEncodingFormat:
    if value in EMBEDDING_REQUEST_ENCODING_FORMAT_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {EMBEDDING_REQUEST_ENCODING_FORMAT_VALUES!r}")
