from typing import Literal

GenDiagnosticsMixingType0 = Literal["fixed", "joint"]

GEN_DIAGNOSTICS_MIXING_TYPE_0_VALUES: set[GenDiagnosticsMixingType0] = {
    "fixed",
    "joint",
}


def check_gen_diagnostics_mixing_type_0(value: str) -> GenDiagnosticsMixingType0:
    if value in GEN_DIAGNOSTICS_MIXING_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GEN_DIAGNOSTICS_MIXING_TYPE_0_VALUES!r}")
