from typing import Literal

InferRequestRetrievalType0 = Literal["dense", "hybrid", "lexical"]

INFER_REQUEST_RETRIEVAL_TYPE_0_VALUES: set[InferRequestRetrievalType0] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_infer_request_retrieval_type_0(value: str) -> InferRequestRetrievalType0:
    if value in INFER_REQUEST_RETRIEVAL_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {INFER_REQUEST_RETRIEVAL_TYPE_0_VALUES!r}")
