from typing import Literal

GenerateRequestRetrievalType0 = Literal["dense", "hybrid", "lexical"]

GENERATE_REQUEST_RETRIEVAL_TYPE_0_VALUES: set[GenerateRequestRetrievalType0] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_generate_request_retrieval_type_0(value: str) -> GenerateRequestRetrievalType0:
    if value in GENERATE_REQUEST_RETRIEVAL_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GENERATE_REQUEST_RETRIEVAL_TYPE_0_VALUES!r}")
