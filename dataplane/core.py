"""Engine core types in one import: errors, SamplingParams, Sequence and the BatchPlan.

Torch-free. The types live in small modules — `dataplane.errors` (typed errors),
`dataplane.sampling_params`, `dataplane.sequence` and `dataplane.batch_plan` — and
this module re-exports them so that one `from dataplane.core import ...` reaches them all.
"""

from __future__ import annotations

from dataplane.batch_plan import (
    BatchPlan,
    adapter_aware_prefill_order,
    build_batch_plan,
    check_batch_plan,
)
from dataplane.errors import (
    EngineError,
    InvalidBatchPlan,
    InvalidRequest,
    InvalidSamplingParams,
    ModelInUse,
)
from dataplane.response_format import InvalidResponseFormat, ResponseFormat
from dataplane.sampling_params import GREEDY_TEMPERATURE, MAX_LOGPROBS, SamplingParams
from dataplane.sequence import (
    BASE_SLOT,
    PLACEHOLDER_TOKEN,
    FinishReason,
    Sequence,
    SequenceStatus,
)

__all__ = [
    "BASE_SLOT",
    "GREEDY_TEMPERATURE",
    "MAX_LOGPROBS",
    "PLACEHOLDER_TOKEN",
    "BatchPlan",
    "EngineError",
    "FinishReason",
    "InvalidBatchPlan",
    "InvalidRequest",
    "InvalidResponseFormat",
    "InvalidSamplingParams",
    "ModelInUse",
    "ResponseFormat",
    "SamplingParams",
    "Sequence",
    "SequenceStatus",
    "adapter_aware_prefill_order",
    "build_batch_plan",
    "check_batch_plan",
]
