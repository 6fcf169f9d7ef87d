from typing import Literal

InferRequestMixing = Literal["fixed", "joint"]

INFER_REQUEST_MIXING_VALUES: set[InferRequestMixing] = {
    "fixed",
    "joint",
}


def check_infer_request_mixing(value: str) -> InferRequestMixing:
    if value in INFER_REQUEST_MIXING_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {INFER_REQUEST_MIXING_VALUES!r}")
