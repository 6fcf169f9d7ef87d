from typing import Literal

ChatMessageRole = Literal["assistant", "system", "user"]

CHAT_MESSAGE_ROLE_VALUES: set[ChatMessageRole] = {
    "assistant",
    "system",
    "user",
}


def check_chat_message_role(value: str) -> ChatMessageRole:
    if value in CHAT_MESSAGE_ROLE_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_MESSAGE_ROLE_VALUES!r}")
