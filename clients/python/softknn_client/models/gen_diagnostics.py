from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.gen_diagnostics_defaults_type_0 import GenDiagnosticsDefaultsType0, check_gen_diagnostics_defaults_type_0
from ..models.gen_diagnostics_mixing_type_0 import GenDiagnosticsMixingType0, check_gen_diagnostics_mixing_type_0
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.gen_diagnostics_sources import GenDiagnosticsSources
    from ..models.grounding_diagnostics import GroundingDiagnostics


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
        memory_source (str): stored fp32/fp16/int8/q4/q2, recomputed, prompt or none
        memory_tokens (int):
        mixing (GenDiagnosticsMixingType0 | None): null: no memory (use_kb false, prompt context)
        positions (str):
        retrieval (bool | None | str): the similarity R was ranked by (null: no retrieval)
        retrieved (int):
        w_db_effective_k (float):
        w_db_entropy (float):
        defaults (GenDiagnosticsDefaultsType0 | None | Unset): where k and β came from when the request left them unset:
            the bundle's calibration or the fixed defaults
        grounding (GroundingDiagnostics | None | Unset): the refusal verdict and why
        prior (float | None | Unset): β of the k-NN prior (joint mixing; null otherwise)
        runtime (None | str | Unset): what decoded: `graph w8a8 int8 kernel` (the decode graph: its weights, KV cache
            and attention, generator.attention) or `torch` (the memory hook: fixed α, exact)
        sources (GenDiagnosticsSources | Unset): where each parameter's value came from: request (the request or the
            command's option), settings (the server's SOFTKNN_DEFAULTS__* / SOFTKNN_GENERATE__*), bundle (its calibration or
            its indexes) or default (the parameter's declared default)
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
    defaults: GenDiagnosticsDefaultsType0 | None | Unset = UNSET
    grounding: GroundingDiagnostics | None | Unset = UNSET
    prior: float | None | Unset = UNSET
    runtime: None | str | Unset = UNSET
    sources: GenDiagnosticsSources | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.grounding_diagnostics import GroundingDiagnostics  # noqa: PLC0415

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

        defaults: None | str | Unset
        if isinstance(self.defaults, Unset):
            defaults = UNSET
        elif isinstance(self.defaults, str):
            defaults = self.defaults
        else:
            defaults = self.defaults

        grounding: dict[str, Any] | None | Unset
        if isinstance(self.grounding, Unset):
            grounding = UNSET
        elif isinstance(self.grounding, GroundingDiagnostics):
            grounding = self.grounding.to_dict()
        else:
            grounding = self.grounding

        prior: float | None | Unset
        if isinstance(self.prior, Unset):
            prior = UNSET
        else:
            prior = self.prior

        runtime: None | str | Unset
        if isinstance(self.runtime, Unset):
            runtime = UNSET
        else:
            runtime = self.runtime

        sources: dict[str, Any] | Unset = UNSET
        if not isinstance(self.sources, Unset):
            sources = self.sources.to_dict()

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
        if defaults is not UNSET:
            field_dict["defaults"] = defaults
        if grounding is not UNSET:
            field_dict["grounding"] = grounding
        if prior is not UNSET:
            field_dict["prior"] = prior
        if runtime is not UNSET:
            field_dict["runtime"] = runtime
        if sources is not UNSET:
            field_dict["sources"] = sources

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.gen_diagnostics_sources import GenDiagnosticsSources  # noqa: PLC0415
        from ..models.grounding_diagnostics import GroundingDiagnostics  # noqa: PLC0415

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

        def _parse_defaults(data: object) -> GenDiagnosticsDefaultsType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                defaults_type_0 = check_gen_diagnostics_defaults_type_0(data)

                return defaults_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(GenDiagnosticsDefaultsType0 | None | Unset, data)

        defaults = _parse_defaults(d.pop("defaults", UNSET))

        def _parse_grounding(data: object) -> GroundingDiagnostics | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                grounding_type_0 = GroundingDiagnostics.from_dict(data)

                return grounding_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(GroundingDiagnostics | None | Unset, data)

        grounding = _parse_grounding(d.pop("grounding", UNSET))

        def _parse_prior(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        prior = _parse_prior(d.pop("prior", UNSET))

        def _parse_runtime(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        runtime = _parse_runtime(d.pop("runtime", UNSET))

        _sources = d.pop("sources", UNSET)
        sources: GenDiagnosticsSources | Unset
        if isinstance(_sources, Unset):
            sources = UNSET
        else:
            sources = GenDiagnosticsSources.from_dict(_sources)

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
            defaults=defaults,
            grounding=grounding,
            prior=prior,
            runtime=runtime,
            sources=sources,
        )

        return gen_diagnostics
