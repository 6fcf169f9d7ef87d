from typing import Literal

RerankRequestTruncationDirection = Literal["right", "Right"]

RERANK_REQUEST_TRUNCATION_DIRECTION_VALUES: set[RerankRequestTruncationDirection] = {
    "right",
    "Right",
}


def check_rerank_request_truncation_direction(value: str) -> RerankRequestTruncationDirection:
    if value in RERANK_REQUEST_TRUNCATION_DIRECTION_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {RERANK_REQUEST_TRUNCATION_DIRECTION_VALUES!r}")
