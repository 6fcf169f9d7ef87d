from typing import Literal

GenerateResponseFinishReason = Literal["cancelled", "length", "stop"]

GENERATE_RESPONSE_FINISH_REASON_VALUES: set[GenerateResponseFinishReason] = {
    "cancelled",
    "length",
    "stop",
}


def check_generate_response_finish_reason(value: str) -> GenerateResponseFinishReason:
    if value in GENERATE_RESPONSE_FINISH_REASON_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GENERATE_RESPONSE_FINISH_REASON_VALUES!r}")
