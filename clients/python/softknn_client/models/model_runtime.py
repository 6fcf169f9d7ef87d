from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="ModelRuntime")


@_attrs_define
class ModelRuntime:
    """
    Attributes:
        fallback (None | str): auto running torch: why onnx did not open here (not the CPU, onnxruntime missing, an
            export that failed its checks); else null
        name (str): what runs the plain forward: torch | onnx
        precision (str): its numerics: fp32 | int8 (SOFTKNN_MODEL__PRECISION)
        requested (str): what SOFTKNN_MODEL__RUNTIME asked for: auto | torch | onnx
        verified_max_abs_diff (float | None): onnx: max |onnx − torch| over the verification inputs, checked at start;
            null for torch
    """

    fallback: None | str
    name: str
    precision: str
    requested: str
    verified_max_abs_diff: float | None

    def to_dict(self) -> dict[str, Any]:
        fallback: None | str
        fallback = self.fallback

        name = self.name

        precision = self.precision

        requested = self.requested

        verified_max_abs_diff: float | None
        verified_max_abs_diff = self.verified_max_abs_diff

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "fallback": fallback,
                "name": name,
                "precision": precision,
                "requested": requested,
                "verified_max_abs_diff": verified_max_abs_diff,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_fallback(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        fallback = _parse_fallback(d.pop("fallback"))

        name = d.pop("name")

        precision = d.pop("precision")

        requested = d.pop("requested")

        def _parse_verified_max_abs_diff(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        verified_max_abs_diff = _parse_verified_max_abs_diff(d.pop("verified_max_abs_diff"))

        model_runtime = cls(
            fallback=fallback,
            name=name,
            precision=precision,
            requested=requested,
            verified_max_abs_diff=verified_max_abs_diff,
        )

        return model_runtime
