"""Typed rejection of adapter artifacts and base checkpoints: one exception, stable codes.

Torch-free (the control plane imports it); `ArtifactRejected` derives from
`dataplane.errors.EngineError`, which is stdlib only.
"""

from __future__ import annotations

from enum import StrEnum

from dataplane.errors import EngineError


class RejectionCode(StrEnum):
    """Why an artifact (or a base checkpoint) was refused. Values are stable API."""

    MISSING_FILE = "missing_file"
    """adapter_config.json / adapter_model.safetensors (or base config/weights) absent."""
    PICKLE_WEIGHTS = "pickle_weights"
    """A pickle-capable weight file (.bin, .pt, .pth, .ckpt, .pkl) is present."""
    FILE_TOO_LARGE = "file_too_large"
    MALFORMED_CONFIG = "malformed_config"
    """Config is not a JSON object or a field has the wrong type/value."""
    MALFORMED_SAFETENSORS = "malformed_safetensors"
    """Bad header length/JSON, bad offsets, or byte size disagreeing with dtype x shape."""
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    """A tensor dtype outside ArtifactLimits.allowed_dtypes, or mixed factor dtypes."""
    UNSUPPORTED_FEATURE = "unsupported_feature"
    """DoRA, trained biases, modules_to_save, embedding/lm_head targets, non-LoRA, ..."""
    UNEXPECTED_KEY = "unexpected_key"
    """A tensor that is not a LoRA A/B factor of a PEFT module (magnitude, embedding, ...)."""
    DUPLICATE_MODULE = "duplicate_module"
    UNKNOWN_MODULE = "unknown_module"
    """A factor for a module that the base model does not have."""
    MISSING_FACTOR = "missing_factor"
    """A module with lora_A but no lora_B, or the reverse."""
    RANK_MISMATCH = "rank_mismatch"
    """A is [r, d_in] but B is [d_out, r'] with r != r'."""
    SHAPE_MISMATCH = "shape_mismatch"
    """Factor shapes do not fit the base projection [d_out, d_in]."""
    RANK_LIMIT = "rank_limit"
    NON_FINITE = "non_finite"
    CONFIG_TENSOR_MISMATCH = "config_tensor_mismatch"
    """Config rank/targets disagree with the tensors present."""
    WRONG_BASE = "wrong_base"
    """No adapted module fits the given base: the adapter was trained for another model."""
    INCONSISTENT_RECORD = "inconsistent_record"
    """A stored record whose digests do not re-derive from its fields."""


class ArtifactRejected(EngineError):
    """An artifact or base checkpoint failed validation.

    `code` is a RejectionCode (set per instance; it is a str, so it fits the root's
    `code: str`), `message` a human sentence, `detail` JSON-able context (module name,
    tensor key, expected/actual values); `str(exc)` is `"<code>: <message>"`. Raising
    changes nothing on disk.
    """

    code: RejectionCode
    code_in_str = True

    def __init__(self, code: RejectionCode, message: str,
                 detail: dict[str, object] | None = None) -> None:
        self.code = code
        super().__init__(message)
        self.detail = dict(detail or {})
