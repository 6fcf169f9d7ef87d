from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..models.write_response_op import WriteResponseOp, check_write_response_op
from ..types import UNSET, Unset

T = TypeVar("T", bound="WriteResponse")


@_attrs_define
class WriteResponse:
    """
    Attributes:
        bundle_version (str): version_id of the bundle that answered
        chunks (int): the document's chunks after the write (0 after a delete)
        created (bool): put: the id was new to the KB
        doc_id (str):
        model (str): serving model name
        model_fingerprint (str): sha256 over the model's weights
        op (WriteResponseOp):
        request_id (str):
        seq (int): this write's number in the KB's write log (1, 2, …; only grows)
        durable (bool | Unset): always true: a write is acknowledged only once its log record is fsynced Default: True.
    """

    bundle_version: str
    chunks: int
    created: bool
    doc_id: str
    model: str
    model_fingerprint: str
    op: WriteResponseOp
    request_id: str
    seq: int
    durable: bool | Unset = True

    def to_dict(self) -> dict[str, Any]:
        bundle_version = self.bundle_version

        chunks = self.chunks

        created = self.created

        doc_id = self.doc_id

        model = self.model

        model_fingerprint = self.model_fingerprint

        op: str = self.op

        request_id = self.request_id

        seq = self.seq

        durable = self.durable

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "bundle_version": bundle_version,
                "chunks": chunks,
                "created": created,
                "doc_id": doc_id,
                "model": model,
                "model_fingerprint": model_fingerprint,
                "op": op,
                "request_id": request_id,
                "seq": seq,
            }
        )
        if durable is not UNSET:
            field_dict["durable"] = durable

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        bundle_version = d.pop("bundle_version")

        chunks = d.pop("chunks")

        created = d.pop("created")

        doc_id = d.pop("doc_id")

        model = d.pop("model")

        model_fingerprint = d.pop("model_fingerprint")

        op = check_write_response_op(d.pop("op"))

        request_id = d.pop("request_id")

        seq = d.pop("seq")

        durable = d.pop("durable", UNSET)

        write_response = cls(
            bundle_version=bundle_version,
            chunks=chunks,
            created=created,
            doc_id=doc_id,
            model=model,
            model_fingerprint=model_fingerprint,
            op=op,
            request_id=request_id,
            seq=seq,
            durable=durable,
        )

        return write_response
