from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.diagnostics import Diagnostics
    from ..models.evidence_item import EvidenceItem
    from ..models.infer_result_label_scores_type_0 import InferResultLabelScoresType0
    from ..models.token import Token
    from ..models.versus_plain import VersusPlain


T = TypeVar("T", bound="InferResult")


@_attrs_define
class InferResult:
    """
    Attributes:
        abstained (bool):
        diagnostics (Diagnostics):
        embedding (list[float]): knowledge-augmented sentence embedding (pooled, normalised)
        evidence (list[EvidenceItem]):
        label_scores (InferResultLabelScoresType0 | None): Σ_c w_db(c)·onehot(label_c), high to low; null when the KB
            has no labels
        prediction (None | str): top label, or null (unlabelled KB, or abstained)
        abstain_reason (None | str | Unset): why no prediction was made
        head_memory_share (list[list[float]] | None | Unset): with return_tokens: (heads, n_tokens)
        token_embeddings (list[list[float]] | None | Unset): with return_tokens: (n_tokens, dim)
        tokens (list[Token] | None | Unset): with return_tokens: the input's tokens
        versus_plain (None | Unset | VersusPlain): with return_tokens: what the KB changed against the plain model's own
            output (label scores come from w_db and do not)
    """

    abstained: bool
    diagnostics: Diagnostics
    embedding: list[float]
    evidence: list[EvidenceItem]
    label_scores: InferResultLabelScoresType0 | None
    prediction: None | str
    abstain_reason: None | str | Unset = UNSET
    head_memory_share: list[list[float]] | None | Unset = UNSET
    token_embeddings: list[list[float]] | None | Unset = UNSET
    tokens: list[Token] | None | Unset = UNSET
    versus_plain: None | Unset | VersusPlain = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.infer_result_label_scores_type_0 import InferResultLabelScoresType0  # noqa: PLC0415
        from ..models.versus_plain import VersusPlain  # noqa: PLC0415

        abstained = self.abstained

        diagnostics = self.diagnostics.to_dict()

        embedding = self.embedding

        evidence = []
        for evidence_item_data in self.evidence:
            evidence_item = evidence_item_data.to_dict()
            evidence.append(evidence_item)

        label_scores: dict[str, Any] | None
        if isinstance(self.label_scores, InferResultLabelScoresType0):
            label_scores = self.label_scores.to_dict()
        else:
            label_scores = self.label_scores

        prediction: None | str
        prediction = self.prediction

        abstain_reason: None | str | Unset
        if isinstance(self.abstain_reason, Unset):
            abstain_reason = UNSET
        else:
            abstain_reason = self.abstain_reason

        head_memory_share: list[list[float]] | None | Unset
        if isinstance(self.head_memory_share, Unset):
            head_memory_share = UNSET
        elif isinstance(self.head_memory_share, list):
            head_memory_share = []
            for head_memory_share_type_0_item_data in self.head_memory_share:
                head_memory_share_type_0_item = head_memory_share_type_0_item_data

                head_memory_share.append(head_memory_share_type_0_item)

        else:
            head_memory_share = self.head_memory_share

        token_embeddings: list[list[float]] | None | Unset
        if isinstance(self.token_embeddings, Unset):
            token_embeddings = UNSET
        elif isinstance(self.token_embeddings, list):
            token_embeddings = []
            for token_embeddings_type_0_item_data in self.token_embeddings:
                token_embeddings_type_0_item = token_embeddings_type_0_item_data

                token_embeddings.append(token_embeddings_type_0_item)

        else:
            token_embeddings = self.token_embeddings

        tokens: list[dict[str, Any]] | None | Unset
        if isinstance(self.tokens, Unset):
            tokens = UNSET
        elif isinstance(self.tokens, list):
            tokens = []
            for tokens_type_0_item_data in self.tokens:
                tokens_type_0_item = tokens_type_0_item_data.to_dict()
                tokens.append(tokens_type_0_item)

        else:
            tokens = self.tokens

        versus_plain: dict[str, Any] | None | Unset
        if isinstance(self.versus_plain, Unset):
            versus_plain = UNSET
        elif isinstance(self.versus_plain, VersusPlain):
            versus_plain = self.versus_plain.to_dict()
        else:
            versus_plain = self.versus_plain

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "abstained": abstained,
                "diagnostics": diagnostics,
                "embedding": embedding,
                "evidence": evidence,
                "label_scores": label_scores,
                "prediction": prediction,
            }
        )
        if abstain_reason is not UNSET:
            field_dict["abstain_reason"] = abstain_reason
        if head_memory_share is not UNSET:
            field_dict["head_memory_share"] = head_memory_share
        if token_embeddings is not UNSET:
            field_dict["token_embeddings"] = token_embeddings
        if tokens is not UNSET:
            field_dict["tokens"] = tokens
        if versus_plain is not UNSET:
            field_dict["versus_plain"] = versus_plain

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.diagnostics import Diagnostics  # noqa: PLC0415
        from ..models.evidence_item import EvidenceItem  # noqa: PLC0415
        from ..models.infer_result_label_scores_type_0 import InferResultLabelScoresType0  # noqa: PLC0415
        from ..models.token import Token  # noqa: PLC0415
        from ..models.versus_plain import VersusPlain  # noqa: PLC0415

        d = dict(src_dict)
        abstained = d.pop("abstained")

        diagnostics = Diagnostics.from_dict(d.pop("diagnostics"))

        embedding = cast(list[float], d.pop("embedding"))

        evidence = []
        _evidence = d.pop("evidence")
        for evidence_item_data in _evidence:
            evidence_item = EvidenceItem.from_dict(evidence_item_data)

            evidence.append(evidence_item)

        def _parse_label_scores(data: object) -> InferResultLabelScoresType0 | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                label_scores_type_0 = InferResultLabelScoresType0.from_dict(data)

                return label_scores_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(InferResultLabelScoresType0 | None, data)

        label_scores = _parse_label_scores(d.pop("label_scores"))

        def _parse_prediction(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        prediction = _parse_prediction(d.pop("prediction"))

        def _parse_abstain_reason(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        abstain_reason = _parse_abstain_reason(d.pop("abstain_reason", UNSET))

        def _parse_head_memory_share(data: object) -> list[list[float]] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                head_memory_share_type_0 = []
                _head_memory_share_type_0 = data
                for head_memory_share_type_0_item_data in _head_memory_share_type_0:
                    head_memory_share_type_0_item = cast(list[float], head_memory_share_type_0_item_data)

                    head_memory_share_type_0.append(head_memory_share_type_0_item)

                return head_memory_share_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[list[float]] | None | Unset, data)

        head_memory_share = _parse_head_memory_share(d.pop("head_memory_share", UNSET))

        def _parse_token_embeddings(data: object) -> list[list[float]] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                token_embeddings_type_0 = []
                _token_embeddings_type_0 = data
                for token_embeddings_type_0_item_data in _token_embeddings_type_0:
                    token_embeddings_type_0_item = cast(list[float], token_embeddings_type_0_item_data)

                    token_embeddings_type_0.append(token_embeddings_type_0_item)

                return token_embeddings_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[list[float]] | None | Unset, data)

        token_embeddings = _parse_token_embeddings(d.pop("token_embeddings", UNSET))

        def _parse_tokens(data: object) -> list[Token] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tokens_type_0 = []
                _tokens_type_0 = data
                for tokens_type_0_item_data in _tokens_type_0:
                    tokens_type_0_item = Token.from_dict(tokens_type_0_item_data)

                    tokens_type_0.append(tokens_type_0_item)

                return tokens_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[Token] | None | Unset, data)

        tokens = _parse_tokens(d.pop("tokens", UNSET))

        def _parse_versus_plain(data: object) -> None | Unset | VersusPlain:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                versus_plain_type_0 = VersusPlain.from_dict(data)

                return versus_plain_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | VersusPlain, data)

        versus_plain = _parse_versus_plain(d.pop("versus_plain", UNSET))

        infer_result = cls(
            abstained=abstained,
            diagnostics=diagnostics,
            embedding=embedding,
            evidence=evidence,
            label_scores=label_scores,
            prediction=prediction,
            abstain_reason=abstain_reason,
            head_memory_share=head_memory_share,
            token_embeddings=token_embeddings,
            tokens=tokens,
            versus_plain=versus_plain,
        )

        return infer_result
