"""Contains all the data models used in inputs/outputs"""

from .bundle_summary import BundleSummary
from .bundle_summary_calibration import BundleSummaryCalibration
from .bundle_summary_counts import BundleSummaryCounts
from .bundle_summary_generator_type_0 import BundleSummaryGeneratorType0
from .bundle_summary_index import BundleSummaryIndex
from .bundle_summary_lexical import BundleSummaryLexical
from .bundle_summary_memory import BundleSummaryMemory
from .bundle_summary_model import BundleSummaryModel
from .chat_choice import ChatChoice
from .chat_choice_finish_reason import ChatChoiceFinishReason
from .chat_choice_message import ChatChoiceMessage
from .chat_completion import ChatCompletion
from .chat_completion_message import ChatCompletionMessage
from .chat_completion_message_role import ChatCompletionMessageRole
from .chat_completion_request import ChatCompletionRequest
from .chat_completion_request_context import ChatCompletionRequestContext
from .chat_completion_request_mixing import ChatCompletionRequestMixing
from .chat_completion_request_positions import ChatCompletionRequestPositions
from .chat_completion_request_retrieval_type_0 import ChatCompletionRequestRetrievalType0
from .chat_message import ChatMessage
from .chat_message_role import ChatMessageRole
from .compact_response import CompactResponse
from .diagnostics import Diagnostics
from .diagnostics_mixing import DiagnosticsMixing
from .diagnostics_retrieval import DiagnosticsRetrieval
from .diagnostics_sources import DiagnosticsSources
from .document_chunk import DocumentChunk
from .document_out import DocumentOut
from .document_out_metadata import DocumentOutMetadata
from .document_request import DocumentRequest
from .document_request_metadata_type_0 import DocumentRequestMetadataType0
from .document_response import DocumentResponse
from .embedding_data import EmbeddingData
from .embedding_extra import EmbeddingExtra
from .embedding_options import EmbeddingOptions
from .embedding_options_kernel import EmbeddingOptionsKernel
from .embedding_options_mixing import EmbeddingOptionsMixing
from .embedding_options_retrieval_type_0 import EmbeddingOptionsRetrievalType0
from .embedding_request import EmbeddingRequest
from .embedding_request_encoding_format import EmbeddingRequestEncodingFormat
from .embedding_response import EmbeddingResponse
from .embedding_usage import EmbeddingUsage
from .entry import Entry
from .entry_metadata import EntryMetadata
from .entry_response import EntryResponse
from .error_detail import ErrorDetail
from .error_response import ErrorResponse
from .evidence_item import EvidenceItem
from .evidence_item_metadata import EvidenceItemMetadata
from .filter_and import FilterAnd
from .filter_match import FilterMatch
from .filter_not import FilterNot
from .filter_or import FilterOr
from .gen_diagnostics import GenDiagnostics
from .gen_diagnostics_defaults_type_0 import GenDiagnosticsDefaultsType0
from .gen_diagnostics_mixing_type_0 import GenDiagnosticsMixingType0
from .gen_diagnostics_sources import GenDiagnosticsSources
from .gen_evidence_item import GenEvidenceItem
from .gen_evidence_item_metadata import GenEvidenceItemMetadata
from .gen_span import GenSpan
from .gen_token_item import GenTokenItem
from .generate_request import GenerateRequest
from .generate_request_context import GenerateRequestContext
from .generate_request_mixing import GenerateRequestMixing
from .generate_request_positions import GenerateRequestPositions
from .generate_request_retrieval_type_0 import GenerateRequestRetrievalType0
from .generate_response import GenerateResponse
from .generate_response_finish_reason import GenerateResponseFinishReason
from .grounding_diagnostics import GroundingDiagnostics
from .healthz_response_healthz import HealthzResponseHealthz
from .index_response import IndexResponse
from .index_response_defaults_type_0 import IndexResponseDefaultsType0
from .index_response_defaults_type_0_additional_property import IndexResponseDefaultsType0AdditionalProperty
from .infer_request import InferRequest
from .infer_request_kernel import InferRequestKernel
from .infer_request_mixing import InferRequestMixing
from .infer_request_retrieval_type_0 import InferRequestRetrievalType0
from .infer_response import InferResponse
from .infer_result import InferResult
from .infer_result_label_scores_type_0 import InferResultLabelScoresType0
from .kb_info import KBInfo
from .kbs_response import KbsResponse
from .model_card import ModelCard
from .model_list import ModelList
from .model_runtime import ModelRuntime
from .neighbour import Neighbour
from .query_token import QueryToken
from .rank import Rank
from .readyz_response_readyz import ReadyzResponseReadyz
from .reload_request import ReloadRequest
from .reload_response import ReloadResponse
from .rerank_request import RerankRequest
from .rerank_request_retrieval_type_0 import RerankRequestRetrievalType0
from .rerank_request_truncation_direction import RerankRequestTruncationDirection
from .softknn_extra import SoftknnExtra
from .span import Span
from .stream_options import StreamOptions
from .text_part import TextPart
from .token import Token
from .usage import Usage
from .versus_plain import VersusPlain
from .write_response import WriteResponse
from .write_response_op import WriteResponseOp

__all__ = (
    "BundleSummary",
    "BundleSummaryCalibration",
    "BundleSummaryCounts",
    "BundleSummaryGeneratorType0",
    "BundleSummaryIndex",
    "BundleSummaryLexical",
    "BundleSummaryMemory",
    "BundleSummaryModel",
    "ChatChoice",
    "ChatChoiceFinishReason",
    "ChatChoiceMessage",
    "ChatCompletion",
    "ChatCompletionMessage",
    "ChatCompletionMessageRole",
    "ChatCompletionRequest",
    "ChatCompletionRequestContext",
    "ChatCompletionRequestMixing",
    "ChatCompletionRequestPositions",
    "ChatCompletionRequestRetrievalType0",
    "ChatMessage",
    "ChatMessageRole",
    "CompactResponse",
    "Diagnostics",
    "DiagnosticsMixing",
    "DiagnosticsRetrieval",
    "DiagnosticsSources",
    "DocumentChunk",
    "DocumentOut",
    "DocumentOutMetadata",
    "DocumentRequest",
    "DocumentRequestMetadataType0",
    "DocumentResponse",
    "EmbeddingData",
    "EmbeddingExtra",
    "EmbeddingOptions",
    "EmbeddingOptionsKernel",
    "EmbeddingOptionsMixing",
    "EmbeddingOptionsRetrievalType0",
    "EmbeddingRequest",
    "EmbeddingRequestEncodingFormat",
    "EmbeddingResponse",
    "EmbeddingUsage",
    "Entry",
    "EntryMetadata",
    "EntryResponse",
    "ErrorDetail",
    "ErrorResponse",
    "EvidenceItem",
    "EvidenceItemMetadata",
    "FilterAnd",
    "FilterMatch",
    "FilterNot",
    "FilterOr",
    "GenDiagnostics",
    "GenDiagnosticsDefaultsType0",
    "GenDiagnosticsMixingType0",
    "GenDiagnosticsSources",
    "GenerateRequest",
    "GenerateRequestContext",
    "GenerateRequestMixing",
    "GenerateRequestPositions",
    "GenerateRequestRetrievalType0",
    "GenerateResponse",
    "GenerateResponseFinishReason",
    "GenEvidenceItem",
    "GenEvidenceItemMetadata",
    "GenSpan",
    "GenTokenItem",
    "GroundingDiagnostics",
    "HealthzResponseHealthz",
    "IndexResponse",
    "IndexResponseDefaultsType0",
    "IndexResponseDefaultsType0AdditionalProperty",
    "InferRequest",
    "InferRequestKernel",
    "InferRequestMixing",
    "InferRequestRetrievalType0",
    "InferResponse",
    "InferResult",
    "InferResultLabelScoresType0",
    "KBInfo",
    "KbsResponse",
    "ModelCard",
    "ModelList",
    "ModelRuntime",
    "Neighbour",
    "QueryToken",
    "Rank",
    "ReadyzResponseReadyz",
    "ReloadRequest",
    "ReloadResponse",
    "RerankRequest",
    "RerankRequestRetrievalType0",
    "RerankRequestTruncationDirection",
    "SoftknnExtra",
    "Span",
    "StreamOptions",
    "TextPart",
    "Token",
    "Usage",
    "VersusPlain",
    "WriteResponse",
    "WriteResponseOp",
)
