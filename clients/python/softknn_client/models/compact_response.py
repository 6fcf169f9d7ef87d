from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.bundle_summary import BundleSummary


T = TypeVar("T", bound="CompactResponse")


@_attrs_define
class CompactResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        index (BundleSummary):
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        recalibrated (bool): a labelled KB's calibration (λ, τ, abstain thresholds) was recomputed
        request_id (str):
        writes_folded (int): logged writes folded into the new base bundle (0: nothing to do)
    """

    bundle_version: str
    index: BundleSummary
    model: str
    model_fingerprint: str
    recalibrated: bool
    request_id: str
    writes_folded: int

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        index = self.index.to_dict()

        model = self.model

        model_fingerprint = self.model_fingerprint

        recalibrated = self.recalibrated

        request_id = self.request_id

        writes_folded = self.writes_folded

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "index": index,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "recalibrated": recalibrated,
                "request_id": request_id,
                "writes_folded": writes_folded,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.bundle_summary import BundleSummary  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        index = BundleSummary.from_dict(d.pop("index"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        recalibrated = d.pop("recalibrated")

        request_id = d.pop("request_id")

        writes_folded = d.pop("writes_folded")

        compact_response = cls(
            bundle_version=bundle_version,
            index=index,
            model=model,
            model_fingerprint=model_fingerprint,
            recalibrated=recalibrated,
            request_id=request_id,
            writes_folded=writes_folded,
        )

        return compact_response
