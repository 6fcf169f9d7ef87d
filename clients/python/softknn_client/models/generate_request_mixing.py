from typing import Literal

GenerateRequestMixing = Literal["fixed", "joint"]

GENERATE_REQUEST_MIXING_VALUES: set[GenerateRequestMixing] = {
    "fixed",
    "joint",
}


def check_generate_request_mixing(value: str) -> GenerateRequestMixing:
    if value in GENERATE_REQUEST_MIXING_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GENERATE_REQUEST_MIXING_VALUES!r}")
