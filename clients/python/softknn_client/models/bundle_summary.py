from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.bundle_summary_calibration import BundleSummaryCalibration
    from ..models.bundle_summary_counts import BundleSummaryCounts
    from ..models.bundle_summary_generator_type_0 import BundleSummaryGeneratorType0
    from ..models.bundle_summary_index import BundleSummaryIndex
    from ..models.bundle_summary_lexical import BundleSummaryLexical
    from ..models.bundle_summary_memory import BundleSummaryMemory
    from ..models.bundle_summary_model import BundleSummaryModel


T = TypeVar("T", bound="BundleSummary")


@_attrs_define
class BundleSummary:
    """
    Attributes:
        bytes_ (int):
        calibration (BundleSummaryCalibration):
        counts (BundleSummaryCounts):
        created_at (None | str):
        index (BundleSummaryIndex):
        kv_dtype (str):
        labels (list[str]):
        lexical (BundleSummaryLexical): the BM25 index: available, default_retrieval, settings, bytes
        memory (BundleSummaryMemory): the memory representation (kv, hidden, hidden-fp16, hidden-int8, recompute): kind,
            files, bytes, bytes_per_chunk
        memory_layer (int):
        model (BundleSummaryModel):
        path (str):
        version_id (str):
        generator (BundleSummaryGeneratorType0 | None | Unset): the generator memory (null: none): model, layers,
            representation, bytes_per_token, and `calibration`, the k and β its build chose from the KB's own pseudo-
            questions
    """

    bytes_: int
    calibration: BundleSummaryCalibration
    counts: BundleSummaryCounts
    created_at: None | str
    index: BundleSummaryIndex
    kv_dtype: str
    labels: list[str]
    lexical: BundleSummaryLexical
    memory: BundleSummaryMemory
    memory_layer: int
    model: BundleSummaryModel
    path: str
    version_id: str
    generator: BundleSummaryGeneratorType0 | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.bundle_summary_generator_type_0 import BundleSummaryGeneratorType0  # noqa: PLC0415

        bytes_ = self.bytes_

        calibration = self.calibration.to_dict()

        counts = self.counts.to_dict()

        created_at: None | str
        created_at = self.created_at

        index = self.index.to_dict()

        kv_dtype = self.kv_dtype

        labels = self.labels

        lexical = self.lexical.to_dict()

        memory = self.memory.to_dict()

        memory_layer = self.memory_layer

        model = self.model.to_dict()

        path = self.path

        version_id = self.version_id

        generator: dict[str, Any] | None | Unset
        if isinstance(self.generator, Unset):
            generator = UNSET
        elif isinstance(self.generator, BundleSummaryGeneratorType0):
            generator = self.generator.to_dict()
        else:
            generator = self.generator

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bytes": bytes_,
                "calibration": calibration,
                "counts": counts,
                "created_at": created_at,
                "index": index,
                "kv_dtype": kv_dtype,
                "labels": labels,
                "lexical": lexical,
                "memory": memory,
                "memory_layer": memory_layer,
                "model": model,
                "path": path,
                "version_id": version_id,
            }
        )
        if generator is not UNSET:
            field_dict["generator"] = generator

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.bundle_summary_calibration import BundleSummaryCalibration  # noqa: PLC0415
        from ..models.bundle_summary_counts import BundleSummaryCounts  # noqa: PLC0415
        from ..models.bundle_summary_generator_type_0 import BundleSummaryGeneratorType0  # noqa: PLC0415
        from ..models.bundle_summary_index import BundleSummaryIndex  # noqa: PLC0415
        from ..models.bundle_summary_lexical import BundleSummaryLexical  # noqa: PLC0415
        from ..models.bundle_summary_memory import BundleSummaryMemory  # noqa: PLC0415
        from ..models.bundle_summary_model import BundleSummaryModel  # noqa: PLC0415

        d = dict(src_dict)
        bytes_ = d.pop("bytes")

        calibration = BundleSummaryCalibration.from_dict(d.pop("calibration"))

        counts = BundleSummaryCounts.from_dict(d.pop("counts"))

        def _parse_created_at(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        created_at = _parse_created_at(d.pop("created_at"))

        index = BundleSummaryIndex.from_dict(d.pop("index"))

        kv_dtype = d.pop("kv_dtype")

        labels = cast(list[str], d.pop("labels"))

        lexical = BundleSummaryLexical.from_dict(d.pop("lexical"))

        memory = BundleSummaryMemory.from_dict(d.pop("memory"))

        memory_layer = d.pop("memory_layer")

        model = BundleSummaryModel.from_dict(d.pop("model"))

        path = d.pop("path")

        version_id = d.pop("version_id")

        def _parse_generator(data: object) -> BundleSummaryGeneratorType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                generator_type_0 = BundleSummaryGeneratorType0.from_dict(data)

                return generator_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(BundleSummaryGeneratorType0 | None | Unset, data)

        generator = _parse_generator(d.pop("generator", UNSET))

        bundle_summary = cls(
            bytes_=bytes_,
            calibration=calibration,
            counts=counts,
            created_at=created_at,
            index=index,
            kv_dtype=kv_dtype,
            labels=labels,
            lexical=lexical,
            memory=memory,
            memory_layer=memory_layer,
            model=model,
            path=path,
            version_id=version_id,
            generator=generator,
        )

        return bundle_summary
