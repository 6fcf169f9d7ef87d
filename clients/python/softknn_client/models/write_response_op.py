from typing import Literal

WriteResponseOp = Literal["delete", "put"]

WRITE_RESPONSE_OP_VALUES: set[WriteResponseOp] = {
    "delete",
    "put",
}


def check_write_response_op(value: str) -> WriteResponseOp:
    if value in WRITE_RESPONSE_OP_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {WRITE_RESPONSE_OP_VALUES!r}")
