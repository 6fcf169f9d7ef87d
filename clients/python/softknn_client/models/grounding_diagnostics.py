from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="GroundingDiagnostics")


@_attrs_define
class GroundingDiagnostics:
    """
    Attributes:
        grounded (bool | None): null: not judged (no retrieval, or a bundle without a refusal threshold)
        note (str):
        refused (bool): the answer is the refusal text; nothing was decoded
        signal (None | str): what was thresholded: nearest_similarity, the nearest KB chunk's dense similarity e_q·e_c
        threshold (float | None): the bundle's refusal threshold (null: it has none)
        value (float | None): the signal's value for this question
    """

    grounded: bool | None
    note: str
    refused: bool
    signal: None | str
    threshold: float | None
    value: float | None

    def to_dict(self) -> dict[str, Any]:
        grounded: bool | None
        grounded = self.grounded

        note = self.note

        refused = self.refused

        signal: None | str
        signal = self.signal

        threshold: float | None
        threshold = self.threshold

        value: float | None
        value = self.value

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "grounded": grounded,
                "note": note,
                "refused": refused,
                "signal": signal,
                "threshold": threshold,
                "value": value,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_grounded(data: object) -> bool | None:
            if data is None:
                return data
            return cast(bool | None, data)

        grounded = _parse_grounded(d.pop("grounded"))

        note = d.pop("note")

        refused = d.pop("refused")

        def _parse_signal(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        signal = _parse_signal(d.pop("signal"))

        def _parse_threshold(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        threshold = _parse_threshold(d.pop("threshold"))

        def _parse_value(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        value = _parse_value(d.pop("value"))

        grounding_diagnostics = cls(
            grounded=grounded,
            note=note,
            refused=refused,
            signal=signal,
            threshold=threshold,
            value=value,
        )

        return grounding_diagnostics
