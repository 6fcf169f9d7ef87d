"""Contains all the data models used in inputs/outputs"""

from .bundle_summary import BundleSummary
from .bundle_summary_calibration import BundleSummaryCalibration
from .bundle_summary_counts import BundleSummaryCounts
from .bundle_summary_index import BundleSummaryIndex
from .bundle_summary_lexical import BundleSummaryLexical
from .bundle_summary_memory import BundleSummaryMemory
from .bundle_summary_model import BundleSummaryModel
from .diagnostics import Diagnostics
from .diagnostics_mixing import DiagnosticsMixing
from .diagnostics_retrieval import DiagnosticsRetrieval
from .entry import Entry
from .entry_metadata import EntryMetadata
from .entry_response import EntryResponse
from .error_detail import ErrorDetail
from .error_response import ErrorResponse
from .evidence_item import EvidenceItem
from .evidence_item_metadata import EvidenceItemMetadata
from .healthz_response_healthz import HealthzResponseHealthz
from .http_validation_error import HTTPValidationError
from .index_response import IndexResponse
from .infer_request import InferRequest
from .infer_request_kernel import InferRequestKernel
from .infer_request_mixing import InferRequestMixing
from .infer_request_retrieval_type_0 import InferRequestRetrievalType0
from .infer_response import InferResponse
from .infer_result import InferResult
from .infer_result_label_scores_type_0 import InferResultLabelScoresType0
from .model_runtime import ModelRuntime
from .neighbour import Neighbour
from .query_token import QueryToken
from .readyz_response_readyz import ReadyzResponseReadyz
from .reload_request import ReloadRequest
from .reload_response import ReloadResponse
from .span import Span
from .token import Token
from .validation_error import ValidationError
from .validation_error_context import ValidationErrorContext
from .versus_plain import VersusPlain

__all__ = (
    "BundleSummary",
    "BundleSummaryCalibration",
    "BundleSummaryCounts",
    "BundleSummaryIndex",
    "BundleSummaryLexical",
    "BundleSummaryMemory",
    "BundleSummaryModel",
    "Diagnostics",
    "DiagnosticsMixing",
    "DiagnosticsRetrieval",
    "Entry",
    "EntryMetadata",
    "EntryResponse",
    "ErrorDetail",
    "ErrorResponse",
    "EvidenceItem",
    "EvidenceItemMetadata",
    "HealthzResponseHealthz",
    "HTTPValidationError",
    "IndexResponse",
    "InferRequest",
    "InferRequestKernel",
    "InferRequestMixing",
    "InferRequestRetrievalType0",
    "InferResponse",
    "InferResult",
    "InferResultLabelScoresType0",
    "ModelRuntime",
    "Neighbour",
    "QueryToken",
    "ReadyzResponseReadyz",
    "ReloadRequest",
    "ReloadResponse",
    "Span",
    "Token",
    "ValidationError",
    "ValidationErrorContext",
    "VersusPlain",
)
