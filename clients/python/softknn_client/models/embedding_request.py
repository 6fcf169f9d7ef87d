from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.embedding_request_encoding_format import (
    EmbeddingRequestEncodingFormat,
    check_embedding_request_encoding_format,
)
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.embedding_options import EmbeddingOptions


T = TypeVar("T", bound="EmbeddingRequest")


@_attrs_define
class EmbeddingRequest:
    """OpenAI-compatible embeddings of one text or a list of texts.

    Attributes:
        input_ (list[int] | list[list[int]] | list[str] | str): a text or 1..limits.max_inputs (64 by default) texts,
            each non-empty and ≤ limits.max_chars (20000 by default) characters and the model's token limit (or
            softknn.truncate); token-id arrays are refused
        dimensions (int | None | Unset): the model's dimension or null: truncated (Matryoshka) embeddings are not
            served, another value is refused (422)
        encoding_format (EmbeddingRequestEncodingFormat | Unset): float: a list of numbers; base64: the little-endian
            float32 bytes, base64-encoded Default: 'float'.
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use, else the one named
            `default` (a name this key may not use answers 404 as one that does not exist)
        model (None | str | Unset): the embedding model's id (GET /v1/models lists it); empty = it; another → 404
            model_not_found
        softknn (EmbeddingOptions | None | Unset): softknn's extension: the knowledge-augmented embedding, truncation
        user (None | str | Unset): accepted, not used
    """

    input_: list[int] | list[list[int]] | list[str] | str
    dimensions: int | None | Unset = UNSET
    encoding_format: EmbeddingRequestEncodingFormat | Unset = "float"
    kb: None | str | Unset = UNSET
    model: None | str | Unset = UNSET
    softknn: EmbeddingOptions | None | Unset = UNSET
    user: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.embedding_options import EmbeddingOptions  # noqa: PLC0415

        input_: list[int] | list[list[int]] | list[str] | str
        if isinstance(self.input_, list):
            input_ = self.input_

        elif isinstance(self.input_, list):
            input_ = self.input_

        elif isinstance(self.input_, list):
            input_ = []
            for input_type_3_item_data in self.input_:
                input_type_3_item = input_type_3_item_data

                input_.append(input_type_3_item)

        else:
            input_ = self.input_

        dimensions: int | None | Unset
        if isinstance(self.dimensions, Unset):
            dimensions = UNSET
        else:
            dimensions = self.dimensions

        encoding_format: str | Unset = UNSET
        if not isinstance(self.encoding_format, Unset):
            encoding_format = self.encoding_format

        kb: None | str | Unset
        if isinstance(self.kb, Unset):
            kb = UNSET
        else:
            kb = self.kb

        model: None | str | Unset
        if isinstance(self.model, Unset):
            model = UNSET
        else:
            model = self.model

        softknn: dict[str, Any] | None | Unset
        if isinstance(self.softknn, Unset):
            softknn = UNSET
        elif isinstance(self.softknn, EmbeddingOptions):
            softknn = self.softknn.to_dict()
        else:
            softknn = self.softknn

        user: None | str | Unset
        if isinstance(self.user, Unset):
            user = UNSET
        else:
            user = self.user

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "input": input_,
            }
        )
        if dimensions is not UNSET:
            field_dict["dimensions"] = dimensions
        if encoding_format is not UNSET:
            field_dict["encoding_format"] = encoding_format
        if kb is not UNSET:
            field_dict["kb"] = kb
        if model is not UNSET:
            field_dict["model"] = model
        if softknn is not UNSET:
            field_dict["softknn"] = softknn
        if user is not UNSET:
            field_dict["user"] = user

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.embedding_options import EmbeddingOptions  # noqa: PLC0415

        d = dict(src_dict)

        def _parse_input_(data: object) -> list[int] | list[list[int]] | list[str] | str:
            try:
                if not isinstance(data, list):
                    raise TypeError()
                input_type_1 = cast(list[str], data)

                return input_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, list):
                    raise TypeError()
                input_type_2 = cast(list[int], data)

                return input_type_2
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, list):
                    raise TypeError()
                input_type_3 = []
                _input_type_3 = data
                for input_type_3_item_data in _input_type_3:
                    input_type_3_item = cast(list[int], input_type_3_item_data)

                    input_type_3.append(input_type_3_item)

                return input_type_3
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[int] | list[list[int]] | list[str] | str, data)

        input_ = _parse_input_(d.pop("input"))

        def _parse_dimensions(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        dimensions = _parse_dimensions(d.pop("dimensions", UNSET))

        _encoding_format = d.pop("encoding_format", UNSET)
        encoding_format: EmbeddingRequestEncodingFormat | Unset
        if isinstance(_encoding_format, Unset):
            encoding_format = UNSET
        else:
            encoding_format = check_embedding_request_encoding_format(_encoding_format)

        def _parse_kb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        kb = _parse_kb(d.pop("kb", UNSET))

        def _parse_model(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        model = _parse_model(d.pop("model", UNSET))

        def _parse_softknn(data: object) -> EmbeddingOptions | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                softknn_type_0 = EmbeddingOptions.from_dict(data)

                return softknn_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EmbeddingOptions | None | Unset, data)

        softknn = _parse_softknn(d.pop("softknn", UNSET))

        def _parse_user(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        user = _parse_user(d.pop("user", UNSET))

        embedding_request = cls(
            input_=input_,
            dimensions=dimensions,
            encoding_format=encoding_format,
            kb=kb,
            model=model,
            softknn=softknn,
            user=user,
        )

        return embedding_request
