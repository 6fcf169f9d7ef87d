from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.gen_diagnostics import GenDiagnostics
    from ..models.gen_evidence_item import GenEvidenceItem
    from ..models.gen_token_item import GenTokenItem


T = TypeVar("T", bound="SoftknnExtra")


@_attrs_define
class SoftknnExtra:
    """
    Attributes:
        bundle_version (str):
        diagnostics (GenDiagnostics):
        evidence (list[GenEvidenceItem]):
        grounded (bool | None): false: the KB does not hold an answer (the nearest chunk is below the bundle's refusal
            threshold); the text is then the refusal text unless the request sent refuse false. null: not judged (use_kb
            false, or a bundle built without a refusal threshold)
        request_id (str):
        tokens (list[GenTokenItem]):
    """

    bundle_version: str
    diagnostics: GenDiagnostics
    evidence: list[GenEvidenceItem]
    grounded: bool | None
    request_id: str
    tokens: list[GenTokenItem]

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        diagnostics = self.diagnostics.to_dict()

        evidence = []
        for evidence_item_data in self.evidence:
            evidence_item = evidence_item_data.to_dict()
            evidence.append(evidence_item)

        grounded: bool | None
        grounded = self.grounded

        request_id = self.request_id

        tokens = []
        for tokens_item_data in self.tokens:
            tokens_item = tokens_item_data.to_dict()
            tokens.append(tokens_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "diagnostics": diagnostics,
                "evidence": evidence,
                "grounded": grounded,
                "request_id": request_id,
                "tokens": tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.gen_diagnostics import GenDiagnostics  # noqa: PLC0415
        from ..models.gen_evidence_item import GenEvidenceItem  # noqa: PLC0415
        from ..models.gen_token_item import GenTokenItem  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        diagnostics = GenDiagnostics.from_dict(d.pop("diagnostics"))

        evidence = []
        _evidence = d.pop("evidence")
        for evidence_item_data in _evidence:
            evidence_item = GenEvidenceItem.from_dict(evidence_item_data)

            evidence.append(evidence_item)

        def _parse_grounded(data: object) -> bool | None:
            if data is None:
                return data
            return cast(bool | None, data)

        grounded = _parse_grounded(d.pop("grounded"))

        request_id = d.pop("request_id")

        tokens = []
        _tokens = d.pop("tokens")
        for tokens_item_data in _tokens:
            tokens_item = GenTokenItem.from_dict(tokens_item_data)

            tokens.append(tokens_item)

        softknn_extra = cls(
            bundle_version=bundle_version,
            diagnostics=diagnostics,
            evidence=evidence,
            grounded=grounded,
            request_id=request_id,
            tokens=tokens,
        )

        return softknn_extra
