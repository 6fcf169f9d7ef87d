from typing import Literal

GenDiagnosticsDefaultsType0 = Literal["calibrated", "fixed"]

GEN_DIAGNOSTICS_DEFAULTS_TYPE_0_VALUES: set[GenDiagnosticsDefaultsType0] = {
    "calibrated",
    "fixed",
}


def check_gen_diagnostics_defaults_type_0(value: str) -> GenDiagnosticsDefaultsType0:
    if value in GEN_DIAGNOSTICS_DEFAULTS_TYPE_0_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {GEN_DIAGNOSTICS_DEFAULTS_TYPE_0_VALUES!r}")
