from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.chat_choice import ChatChoice
    from ..models.softknn_extra import SoftknnExtra
    from ..models.usage import Usage


T = TypeVar("T", bound="ChatCompletion")


@_attrs_define
class ChatCompletion:
    """
    Attributes:
        choices (list[ChatChoice]):
        created (int):
        id (str): chatcmpl-<request id>
        model (str):
        object_ (Literal['chat.completion']):
        softknn (SoftknnExtra):
        system_fingerprint (None | str): the bundle version
        usage (Usage):
    """

    choices: list[ChatChoice]
    created: int
    id: str
    model: str
    object_: Literal["chat.completion"]
    softknn: SoftknnExtra
    system_fingerprint: None | str
    usage: Usage

    def to_dict(self) -> dict[str, Any]:
        choices = []
        for choices_item_data in self.choices:
            choices_item = choices_item_data.to_dict()
            choices.append(choices_item)

        created = self.created

        id = self.id

        model = self.model

        object_ = self.object_

        softknn = self.softknn.to_dict()

        system_fingerprint: None | str
        system_fingerprint = self.system_fingerprint

        usage = self.usage.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "choices": choices,
                "created": created,
                "id": id,
                "model": model,
                "object": object_,
                "softknn": softknn,
                "system_fingerprint": system_fingerprint,
                "usage": usage,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.chat_choice import ChatChoice  # noqa: PLC0415
        from ..models.softknn_extra import SoftknnExtra  # noqa: PLC0415
        from ..models.usage import Usage  # noqa: PLC0415

        d = dict(src_dict)
        choices = []
        _choices = d.pop("choices")
        for choices_item_data in _choices:
            choices_item = ChatChoice.from_dict(choices_item_data)

            choices.append(choices_item)

        created = d.pop("created")

        id = d.pop("id")

        model = d.pop("model")

        object_ = cast(Literal["chat.completion"], d.pop("object"))
        if object_ != "chat.completion":
            raise ValueError(f"object must match const 'chat.completion', got '{object_}'")

        softknn = SoftknnExtra.from_dict(d.pop("softknn"))

        def _parse_system_fingerprint(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        system_fingerprint = _parse_system_fingerprint(d.pop("system_fingerprint"))

        usage = Usage.from_dict(d.pop("usage"))

        chat_completion = cls(
            choices=choices,
            created=created,
            id=id,
            model=model,
            object_=object_,
            softknn=softknn,
            system_fingerprint=system_fingerprint,
            usage=usage,
        )

        return chat_completion
