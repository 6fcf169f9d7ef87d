from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="EmbeddingUsage")


@_attrs_define
class EmbeddingUsage:
    """
    Attributes:
        prompt_tokens (int): tokens the model ran on, special tokens included, after any cut (the encoder's tokenizer)
        total_tokens (int):
    """

    prompt_tokens: int
    total_tokens: int

    def to_dict(self) -> dict[str, Any]:
        prompt_tokens = self.prompt_tokens

        total_tokens = self.total_tokens

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "prompt_tokens": prompt_tokens,
                "total_tokens": total_tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        prompt_tokens = d.pop("prompt_tokens")

        total_tokens = d.pop("total_tokens")

        embedding_usage = cls(
            prompt_tokens=prompt_tokens,
            total_tokens=total_tokens,
        )

        return embedding_usage
