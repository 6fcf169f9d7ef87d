from typing import Literal

DiagnosticsMixing = Literal["fixed", "joint"]

DIAGNOSTICS_MIXING_VALUES: set[DiagnosticsMixing] = {
    "fixed",
    "joint",
}


def check_diagnostics_mixing(value: str) -> DiagnosticsMixing:
    if value in DIAGNOSTICS_MIXING_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {DIAGNOSTICS_MIXING_VALUES!r}")
