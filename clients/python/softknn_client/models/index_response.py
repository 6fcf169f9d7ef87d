from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.bundle_summary import BundleSummary
    from ..models.index_response_defaults_type_0 import IndexResponseDefaultsType0
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
        defaults (IndexResponseDefaultsType0 | None | Unset): what this server gives a request parameter left unset, by
            route family (infer: /v1/infer, /v1/embeddings, /v1/rerank; generate: /v1/generate, chat completions): its
            settings SOFTKNN_DEFAULTS__*, SOFTKNN_GENERATE__*; null: the bundle's own
    """

    bundle_version: str
    index: BundleSummary
    model: str
    model_fingerprint: str
    request_id: str
    runtime: ModelRuntime
    defaults: IndexResponseDefaultsType0 | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.index_response_defaults_type_0 import IndexResponseDefaultsType0  # noqa: PLC0415

        bundle_version = self.bundle_version

        index = self.index.to_dict()

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        runtime = self.runtime.to_dict()

        defaults: dict[str, Any] | None | Unset
        if isinstance(self.defaults, Unset):
            defaults = UNSET
        elif isinstance(self.defaults, IndexResponseDefaultsType0):
            defaults = self.defaults.to_dict()
        else:
            defaults = self.defaults

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
        if defaults is not UNSET:
            field_dict["defaults"] = defaults

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.bundle_summary import BundleSummary  # noqa: PLC0415
        from ..models.index_response_defaults_type_0 import IndexResponseDefaultsType0  # noqa: PLC0415
        from ..models.model_runtime import ModelRuntime  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        index = BundleSummary.from_dict(d.pop("index"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        runtime = ModelRuntime.from_dict(d.pop("runtime"))

        def _parse_defaults(data: object) -> IndexResponseDefaultsType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                defaults_type_0 = IndexResponseDefaultsType0.from_dict(data)

                return defaults_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(IndexResponseDefaultsType0 | None | Unset, data)

        defaults = _parse_defaults(d.pop("defaults", UNSET))

        index_response = cls(
            bundle_version=bundle_version,
            index=index,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
            runtime=runtime,
            defaults=defaults,
        )

        return index_response
