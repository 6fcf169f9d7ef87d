from typing import Literal

RerankRequestRetrievalType0 = Literal["dense", "hybrid", "lexical"]

RERANK_REQUEST_RETRIEVAL_TYPE_0_VALUES: set[RerankRequestRetrievalType0] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_rerank_request_retrieval_type_0(value: str) -> RerankRequestRetrievalType0:
    if value in RERANK_REQUEST_RETRIEVAL_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {RERANK_REQUEST_RETRIEVAL_TYPE_0_VALUES!r}")
