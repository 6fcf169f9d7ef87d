from typing import Literal

ChatCompletionMessageRole = Literal["assistant", "developer", "system", "user"]

CHAT_COMPLETION_MESSAGE_ROLE_VALUES: set[ChatCompletionMessageRole] = {
    "assistant",
    "developer",
    "system",
    "user",
}


def check_chat_completion_message_role(value: str) -> ChatCompletionMessageRole:
    if value in CHAT_COMPLETION_MESSAGE_ROLE_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_COMPLETION_MESSAGE_ROLE_VALUES!r}")
