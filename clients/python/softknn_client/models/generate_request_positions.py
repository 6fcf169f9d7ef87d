from typing import Literal

GenerateRequestPositions = Literal["composite", "reordered"]

GENERATE_REQUEST_POSITIONS_VALUES: set[GenerateRequestPositions] = {
    "composite",
    "reordered",
}


def check_generate_request_positions(value: str) -> GenerateRequestPositions:
    if value in GENERATE_REQUEST_POSITIONS_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GENERATE_REQUEST_POSITIONS_VALUES!r}")
