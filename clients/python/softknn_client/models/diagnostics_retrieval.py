from typing import Literal

DiagnosticsRetrieval = Literal["dense", "hybrid", "lexical"]

DIAGNOSTICS_RETRIEVAL_VALUES: set[DiagnosticsRetrieval] = {
    "dense",
    "hybrid",
    "lexical",
}


def check_diagnostics_retrieval(value: str) -> DiagnosticsRetrieval:
    if value in DIAGNOSTICS_RETRIEVAL_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {DIAGNOSTICS_RETRIEVAL_VALUES!r}")
