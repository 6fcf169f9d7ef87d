from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.bundle_summary import BundleSummary
    from ..models.model_runtime import ModelRuntime


T = TypeVar("T", bound="IndexResponse")


@_attrs_define
class IndexResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        index (BundleSummary):
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        request_id (str):
        runtime (ModelRuntime):
    """

    bundle_version: str
    index: BundleSummary
    model: str
    model_fingerprint: str
    request_id: str
    runtime: ModelRuntime

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        index = self.index.to_dict()

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        runtime = self.runtime.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "index": index,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "request_id": request_id,
                "runtime": runtime,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.bundle_summary import BundleSummary  # noqa: PLC0415
        from ..models.model_runtime import ModelRuntime  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        index = BundleSummary.from_dict(d.pop("index"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        runtime = ModelRuntime.from_dict(d.pop("runtime"))

        index_response = cls(
            bundle_version=bundle_version,
            index=index,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
            runtime=runtime,
        )

        return index_response
