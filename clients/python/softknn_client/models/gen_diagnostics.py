from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.gen_diagnostics_mixing_type_0 import GenDiagnosticsMixingType0, check_gen_diagnostics_mixing_type_0

T = TypeVar("T", bound="GenDiagnostics")


@_attrs_define
class GenDiagnostics:
    """
    Attributes:
        alpha (float | None):
        attention_effective_k (float):
        exact (bool):
        filtered (int | None): chunks that pass the request's filter (null: no filter or no retrieval)
        k (int):
        memory_layers (int):
        memory_share (float): mean over generated tokens of the memory's attention mass
        memory_source (str): stored fp32/fp16/int8, recomputed, prompt or none
        memory_tokens (int):
        mixing (GenDiagnosticsMixingType0 | None): null: no memory (use_kb false, prompt context)
        positions (str):
        retrieval (bool | None | str): the similarity R was ranked by (null: no retrieval)
        retrieved (int):
        w_db_effective_k (float):
        w_db_entropy (float):
    """

    alpha: float | None
    attention_effective_k: float
    exact: bool
    filtered: int | None
    k: int
    memory_layers: int
    memory_share: float
    memory_source: str
    memory_tokens: int
    mixing: GenDiagnosticsMixingType0 | None
    positions: str
    retrieval: bool | None | str
    retrieved: int
    w_db_effective_k: float
    w_db_entropy: float

    def to_dict(self) -> dict[str, Any]:
        alpha: float | None
        alpha = self.alpha

        attention_effective_k = self.attention_effective_k

        exact = self.exact

        filtered: int | None
        filtered = self.filtered

        k = self.k

        memory_layers = self.memory_layers

        memory_share = self.memory_share

        memory_source = self.memory_source

        memory_tokens = self.memory_tokens

        mixing: None | str
        if isinstance(self.mixing, str):
            mixing = self.mixing
        else:
            mixing = self.mixing

        positions = self.positions

        retrieval: bool | None | str
        retrieval = self.retrieval

        retrieved = self.retrieved

        w_db_effective_k = self.w_db_effective_k

        w_db_entropy = self.w_db_entropy

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "alpha": alpha,
                "attention_effective_k": attention_effective_k,
                "exact": exact,
                "filtered": filtered,
                "k": k,
                "memory_layers": memory_layers,
                "memory_share": memory_share,
                "memory_source": memory_source,
                "memory_tokens": memory_tokens,
                "mixing": mixing,
                "positions": positions,
                "retrieval": retrieval,
                "retrieved": retrieved,
                "w_db_effective_k": w_db_effective_k,
                "w_db_entropy": w_db_entropy,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)

        def _parse_alpha(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        alpha = _parse_alpha(d.pop("alpha"))

        attention_effective_k = d.pop("attention_effective_k")

        exact = d.pop("exact")

        def _parse_filtered(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        filtered = _parse_filtered(d.pop("filtered"))

        k = d.pop("k")

        memory_layers = d.pop("memory_layers")

        memory_share = d.pop("memory_share")

        memory_source = d.pop("memory_source")

        memory_tokens = d.pop("memory_tokens")

        def _parse_mixing(data: object) -> GenDiagnosticsMixingType0 | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                mixing_type_0 = check_gen_diagnostics_mixing_type_0(data)

                return mixing_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(GenDiagnosticsMixingType0 | None, data)

        mixing = _parse_mixing(d.pop("mixing"))

        positions = d.pop("positions")

        def _parse_retrieval(data: object) -> bool | None | str:
            if data is None:
                return data
            return cast(bool | None | str, data)

        retrieval = _parse_retrieval(d.pop("retrieval"))

        retrieved = d.pop("retrieved")

        w_db_effective_k = d.pop("w_db_effective_k")

        w_db_entropy = d.pop("w_db_entropy")

        gen_diagnostics = cls(
            alpha=alpha,
            attention_effective_k=attention_effective_k,
            exact=exact,
            filtered=filtered,
            k=k,
            memory_layers=memory_layers,
            memory_share=memory_share,
            memory_source=memory_source,
            memory_tokens=memory_tokens,
            mixing=mixing,
            positions=positions,
            retrieval=retrieval,
            retrieved=retrieved,
            w_db_effective_k=w_db_effective_k,
            w_db_entropy=w_db_entropy,
        )

        return gen_diagnostics
