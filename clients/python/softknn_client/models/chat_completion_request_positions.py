from typing import Literal

ChatCompletionRequestPositions = Literal["composite", "reordered"]

CHAT_COMPLETION_REQUEST_POSITIONS_VALUES: set[ChatCompletionRequestPositions] = {
    "composite",
    "reordered",
}


def check_chat_completion_request_positions(value: str) -> ChatCompletionRequestPositions:
    if value in CHAT_COMPLETION_REQUEST_POSITIONS_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_COMPLETION_REQUEST_POSITIONS_VALUES!r}")
