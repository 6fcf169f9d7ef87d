from typing import Literal

ChatCompletionRequestContext = Literal["memory", "prompt"]

CHAT_COMPLETION_REQUEST_CONTEXT_VALUES: set[ChatCompletionRequestContext] = {
    "memory",
    "prompt",
}


def check_chat_completion_request_context(value: str) -> ChatCompletionRequestContext:
    if value in CHAT_COMPLETION_REQUEST_CONTEXT_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_COMPLETION_REQUEST_CONTEXT_VALUES!r}")
