"""Domain errors. No HTTP in here: the service maps each class to a status in one place."""


class SoftKNNError(Exception):
    """Base class. `field` names the offending input where there is one."""

    kind = "softknn_error"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(SoftKNNError):
    """A request or file field has a value the core cannot use."""

    kind = "invalid_input"


class InputTooLarge(SoftKNNError):
    """An input exceeds a size limit (characters, tokens, items) and truncation was not asked for."""

    kind = "input_too_large"


class BundleError(SoftKNNError):
    """A bundle is missing, corrupt (checksum), of another format version, or for another model."""

    kind = "bundle_error"


class KBFormatError(SoftKNNError):
    """A knowledge-base input file cannot be read; the message names the file and line."""

    kind = "kb_format_error"


class UnsupportedModel(SoftKNNError):
    """The model's architecture does not expose per-layer attention softknn can fuse into."""

    kind = "unsupported_model"


class ShardUnavailable(SoftKNNError):
    """A shard of a sharded bundle did not answer (its Ray actor died and is restarting, or timed out):
    no answer is computed without its chunks. The service answers 503 with Retry-After."""

    kind = "shard_unavailable"
    headers: dict[str, str] | None = {"Retry-After": "1"}


class ShardMismatch(ShardUnavailable):
    """A shard answered for another version of its files than the bundle this process serves (its
    directory was rebuilt in place and its actor reopened it): the answer is refused, never merged.
    A retry does not help; a reload serves the new version."""

    kind = "shard_version_mismatch"
    headers = None


class ShardsNotPlaced(ShardUnavailable):
    """The cluster could not place a bundle's shard actors within the deadline (no room: CPUs or the
    requested resources); nothing of that bundle is served, the one serving keeps serving."""

    kind = "shards_not_placed"
    headers = None


class ModelRuntimeError(SoftKNNError):
    """The model runtime cannot be used: an export that fails verification, a bad runtime setting."""

    kind = "model_runtime_error"


class WriteRefused(SoftKNNError):
    """A KB write this bundle cannot take (sharded, generator memory, a memory whose encoding depends
    on every chunk): the service answers 409."""

    kind = "write_refused"


class DocumentNotFound(SoftKNNError):
    """A document id the KB does not hold (GET or DELETE /v1/documents/{doc_id}): 404."""

    kind = "not_found"
