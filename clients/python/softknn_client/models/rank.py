from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="Rank")


@_attrs_define
class Rank:
    """
    Attributes:
        index (int): position of the text in `texts`
        score (float): s_t, the retrieval's similarity for this text (docs/design.md, "Rerank")
        text (None | str | Unset): the text, with return_text
    """

    index: int
    score: float
    text: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        index = self.index

        score = self.score

        text: None | str | Unset
        if isinstance(self.text, Unset):
            text = UNSET
        else:
            text = self.text

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "index": index,
                "score": score,
            }
        )
        if text is not UNSET:
            field_dict["text"] = text

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        index = d.pop("index")

        score = d.pop("score")

        def _parse_text(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        text = _parse_text(d.pop("text", UNSET))

        rank = cls(
            index=index,
            score=score,
            text=text,
        )

        return rank
