from typing import Literal

ChatChoiceFinishReason = Literal["length", "stop"]

CHAT_CHOICE_FINISH_REASON_VALUES: set[ChatChoiceFinishReason] = {
    "length",
    "stop",
}


def check_chat_choice_finish_reason(value: str) -> ChatChoiceFinishReason:
    if value in CHAT_CHOICE_FINISH_REASON_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CHAT_CHOICE_FINISH_REASON_VALUES!r}")
