from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.infer_result import InferResult


T = TypeVar("T", bound="InferResponse")


@_attrs_define
class InferResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        request_id (str):
        results (list[InferResult]): one result per input, in order
    """

    bundle_version: str
    model: str
    model_fingerprint: str
    request_id: str
    results: list[InferResult]

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        results = []
        for results_item_data in self.results:
            results_item = results_item_data.to_dict()
            results.append(results_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "request_id": request_id,
                "results": results,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.infer_result import InferResult  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        results = []
        _results = d.pop("results")
        for results_item_data in _results:
            results_item = InferResult.from_dict(results_item_data)

            results.append(results_item)

        infer_response = cls(
            bundle_version=bundle_version,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
            results=results,
        )

        return infer_response
