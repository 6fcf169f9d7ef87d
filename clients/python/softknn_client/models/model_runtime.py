from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="ModelRuntime")


@_attrs_define
class ModelRuntime:
    """
    Attributes:
        name (str): what runs the plain forward: torch | onnx (SOFTKNN_MODEL__RUNTIME)
        precision (str): its numerics: fp32 | int8 (SOFTKNN_MODEL__PRECISION)
        verified_max_abs_diff (float | None): onnx: max |onnx − torch| over the verification inputs, checked at start;
            null for torch
    """

    name: str
    precision: str
    verified_max_abs_diff: float | None

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        precision = self.precision

        verified_max_abs_diff: float | None
        verified_max_abs_diff = self.verified_max_abs_diff

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
                "precision": precision,
                "verified_max_abs_diff": verified_max_abs_diff,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        name = d.pop("name")

        precision = d.pop("precision")

        def _parse_verified_max_abs_diff(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        verified_max_abs_diff = _parse_verified_max_abs_diff(d.pop("verified_max_abs_diff"))

        model_runtime = cls(
            name=name,
            precision=precision,
            verified_max_abs_diff=verified_max_abs_diff,
        )

        return model_runtime
