from typing import Literal

GenerateRequestContext = Literal["memory", "prompt"]

GENERATE_REQUEST_CONTEXT_VALUES: set[GenerateRequestContext] = {
    "memory",
    "prompt",
}


def check_generate_request_context(value: str) -> GenerateRequestContext:
    if value in GENERATE_REQUEST_CONTEXT_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GENERATE_REQUEST_CONTEXT_VALUES!r}")
