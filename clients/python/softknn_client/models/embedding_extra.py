from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="EmbeddingExtra")


@_attrs_define
class EmbeddingExtra:
    """
    Attributes:
        augmented (bool): true: knowledge-augmented embeddings (the fused memory layer)
        bundle_version (None | str): the bundle the augmented embeddings drew on (null: plain)
        request_id (str):
    """

    augmented: bool
    bundle_version: None | str
    request_id: str

    def to_dict(self) -> dict[str, Any]:
        augmented = self.augmented

        bundle_version: None | str
        bundle_version = self.bundle_version

        request_id = self.request_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "augmented": augmented,
                "bundle_version": bundle_version,
                "request_id": request_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        augmented = d.pop("augmented")

        def _parse_bundle_version(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        bundle_version = _parse_bundle_version(d.pop("bundle_version"))

        request_id = d.pop("request_id")

        embedding_extra = cls(
            augmented=augmented,
            bundle_version=bundle_version,
            request_id=request_id,
        )

        return embedding_extra
