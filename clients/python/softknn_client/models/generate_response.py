from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.generate_response_finish_reason import GenerateResponseFinishReason, check_generate_response_finish_reason

if TYPE_CHECKING:
    from ..models.gen_diagnostics import GenDiagnostics
    from ..models.gen_evidence_item import GenEvidenceItem
    from ..models.gen_token_item import GenTokenItem
    from ..models.usage import Usage


T = TypeVar("T", bound="GenerateResponse")


@_attrs_define
class GenerateResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        diagnostics (GenDiagnostics):
        evidence (list[GenEvidenceItem]):
        finish_reason (GenerateResponseFinishReason):
        generator (str): the generator's name
        grounded (bool | None): false: the KB does not hold an answer (the nearest chunk is below the bundle's refusal
            threshold); the text is then the refusal text unless the request sent refuse false. null: not judged (use_kb
            false, or a bundle built without a refusal threshold)
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        request_id (str):
        text (str):
        tokens (list[GenTokenItem]):
        usage (Usage):
    """

    bundle_version: str
    diagnostics: GenDiagnostics
    evidence: list[GenEvidenceItem]
    finish_reason: GenerateResponseFinishReason
    generator: str
    grounded: bool | None
    model: str
    model_fingerprint: str
    request_id: str
    text: str
    tokens: list[GenTokenItem]
    usage: Usage

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        diagnostics = self.diagnostics.to_dict()

        evidence = []
        for evidence_item_data in self.evidence:
            evidence_item = evidence_item_data.to_dict()
            evidence.append(evidence_item)

        finish_reason: str = self.finish_reason

        generator = self.generator

        grounded: bool | None
        grounded = self.grounded

        model = self.model

        model_fingerprint = self.model_fingerprint

        request_id = self.request_id

        text = self.text

        tokens = []
        for tokens_item_data in self.tokens:
            tokens_item = tokens_item_data.to_dict()
            tokens.append(tokens_item)

        usage = self.usage.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "diagnostics": diagnostics,
                "evidence": evidence,
                "finish_reason": finish_reason,
                "generator": generator,
                "grounded": grounded,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "request_id": request_id,
                "text": text,
                "tokens": tokens,
                "usage": usage,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.gen_diagnostics import GenDiagnostics  # noqa: PLC0415
        from ..models.gen_evidence_item import GenEvidenceItem  # noqa: PLC0415
        from ..models.gen_token_item import GenTokenItem  # noqa: PLC0415
        from ..models.usage import Usage  # noqa: PLC0415

        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        diagnostics = GenDiagnostics.from_dict(d.pop("diagnostics"))

        evidence = []
        _evidence = d.pop("evidence")
        for evidence_item_data in _evidence:
            evidence_item = GenEvidenceItem.from_dict(evidence_item_data)

            evidence.append(evidence_item)

        finish_reason = check_generate_response_finish_reason(d.pop("finish_reason"))

        generator = d.pop("generator")

        def _parse_grounded(data: object) -> bool | None:
            if data is None:
                return data
            return cast(bool | None, data)

        grounded = _parse_grounded(d.pop("grounded"))

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        request_id = d.pop("request_id")

        text = d.pop("text")

        tokens = []
        _tokens = d.pop("tokens")
        for tokens_item_data in _tokens:
            tokens_item = GenTokenItem.from_dict(tokens_item_data)

            tokens.append(tokens_item)

        usage = Usage.from_dict(d.pop("usage"))

        generate_response = cls(
            bundle_version=bundle_version,
            diagnostics=diagnostics,
            evidence=evidence,
            finish_reason=finish_reason,
            generator=generator,
            grounded=grounded,
            model=model,
            model_fingerprint=model_fingerprint,
            request_id=request_id,
            text=text,
            tokens=tokens,
            usage=usage,
        )

        return generate_response
