from typing import Literal

ChatCompletionRequestMixing = Literal["fixed", "joint"]

CHAT_COMPLETION_REQUEST_MIXING_VALUES: set[ChatCompletionRequestMixing] = {
    "fixed",
    "joint",
}


def check_chat_completion_request_mixing(value: str) -> ChatCompletionRequestMixing:
    if value in CHAT_COMPLETION_REQUEST_MIXING_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_COMPLETION_REQUEST_MIXING_VALUES!r}")
