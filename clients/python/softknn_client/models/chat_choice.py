from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..models.chat_choice_finish_reason import ChatChoiceFinishReason, check_chat_choice_finish_reason
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chat_choice_message import ChatChoiceMessage


T = TypeVar("T", bound="ChatChoice")


@_attrs_define
class ChatChoice:
    """
    Attributes:
        finish_reason (ChatChoiceFinishReason):
        index (int):
        message (ChatChoiceMessage):
        logprobs (None | Unset):
    """

    finish_reason: ChatChoiceFinishReason
    index: int
    message: ChatChoiceMessage
    logprobs: None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        finish_reason: str = self.finish_reason

        index = self.index

        message = self.message.to_dict()

        logprobs = self.logprobs

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "finish_reason": finish_reason,
                "index": index,
                "message": message,
            }
        )
        if logprobs is not UNSET:
            field_dict["logprobs"] = logprobs

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.chat_choice_message import ChatChoiceMessage  # noqa: PLC0415

        d = dict(src_dict)
        finish_reason = check_chat_choice_finish_reason(d.pop("finish_reason"))

        index = d.pop("index")

        message = ChatChoiceMessage.from_dict(d.pop("message"))

        logprobs = d.pop("logprobs", UNSET)

        chat_choice = cls(
            finish_reason=finish_reason,
            index=index,
            message=message,
            logprobs=logprobs,
        )

        return chat_choice
