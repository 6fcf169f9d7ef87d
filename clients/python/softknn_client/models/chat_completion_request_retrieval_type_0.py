from typing import Literal

ChatCompletionRequestRetrievalType0 = Literal["dense", "hybrid", "lexical"]

CHAT_COMPLETION_REQUEST_RETRIEVAL_TYPE_0_VALUES: set[ChatCompletionRequestRetrievalType0] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_chat_completion_request_retrieval_type_0(value: str) -> ChatCompletionRequestRetrievalType0:
    if value in CHAT_COMPLETION_REQUEST_RETRIEVAL_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_COMPLETION_REQUEST_RETRIEVAL_TYPE_0_VALUES!r}")
