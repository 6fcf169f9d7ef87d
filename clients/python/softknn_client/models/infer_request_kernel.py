from typing import Literal

InferRequestKernel = Literal["epanechnikov", "softmax", "uniform"]

INFER_REQUEST_KERNEL_VALUES: set[InferRequestKernel] = {
    "epanechnikov",
    "softmax",
    "uniform",
}


def check_infer_request_kernel(value: str) -> InferRequestKernel:
    if value in INFER_REQUEST_KERNEL_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {INFER_REQUEST_KERNEL_VALUES!r}")
