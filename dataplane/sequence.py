"""Sequence: one request's mutable engine state (tokens, KV progress, adapter binding).

Torch-free. The scheduler owns every `Sequence`; `BatchPlan` reads them, never mutates them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dataplane.errors import InvalidRequest
from dataplane.errors import is_int as _is_int
from dataplane.sampling_params import SamplingParams

BASE_SLOT = -1
"""Adapter slot of a row that runs the base model only (exact zero LoRA delta)."""

PLACEHOLDER_TOKEN = -1
"""Stands for a sampled token still on the device (async scheduling): appended to a running
sequence when its step is launched, replaced by the real token when the step finishes.
Only ever the last token, never hashed (not computed yet) and never a model input: the
runner overwrites its row from the previous step's sampled-token tensor."""


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """OpenAI-compatible finish reasons."""

    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens (or the model's context) reached
    ABORT = "abort"  # cancelled
    DEADLINE = "deadline"  # not admitted before its queue deadline (never started)


@dataclass(eq=False)
class Sequence:
    """One request's mutable engine state. Owned by the scheduler.

    `token_ids` = prompt followed by generated tokens. `num_computed_tokens` counts tokens whose
    K/V is in the cache (including prefix-cache hits, `num_cached_tokens`). `block_table` lists
    the KV block ids covering positions [0, len * block_size). `adapter_slot` is -1 for base;
    `adapter_digest` is the adapter's semantic digest (None for base) and is what the prefix
    cache keys on — never the slot or the alias. `isolation_namespace` partitions the prefix
    cache (requests in different namespaces never share cached blocks). `tenant` is whose
    service the request's completed work counts as (dataplane/engine/fairness.py).
    `adapter_rank` is the adapter's largest module rank (the scheduler's cost vector).
    `active_from` is the first position the adapter applies to (an activated LoRA's
    invocation offset, engine/activation.py; 0 for plain LoRA): rows before it run as base.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter_slot: int = BASE_SLOT
    adapter_digest: str | None = None
    adapter_rank: int = 0
    active_from: int = 0
    arrival: int = 0
    arrival_round: int = 0
    """The scheduling round in which the request was queued (its age is counted in rounds)."""
    token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    output_text: str = ""
    isolation_namespace: str = "default"
    tenant: str = ""
    queue_deadline: float | None = None
    """Monotonic time (`time.monotonic`) by which the request must be admitted, or it is
    dropped unstarted (FinishReason.DEADLINE); None: it waits as long as it takes."""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise InvalidRequest("request_id must be a non-empty str")
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        if not self.prompt_token_ids:
            raise InvalidRequest("prompt must have at least one token", request_id=self.request_id)
        if any(not _is_int(t) or t < 0 for t in self.prompt_token_ids):
            raise InvalidRequest("prompt token ids must be ints >= 0", request_id=self.request_id)
        if not _is_int(self.adapter_slot) or self.adapter_slot < BASE_SLOT:
            raise InvalidRequest("adapter_slot must be -1 (base) or a slot index >= 0",
                                 adapter_slot=self.adapter_slot)
        if (self.adapter_slot == BASE_SLOT) != (self.adapter_digest is None):
            raise InvalidRequest("adapter_digest must be set exactly when adapter_slot >= 0",
                                 request_id=self.request_id)
        if not _is_int(self.active_from) or not 0 <= self.active_from < len(
                self.prompt_token_ids):
            raise InvalidRequest("active_from must be a prompt position",
                                 request_id=self.request_id, active_from=self.active_from)
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """True while more than the last token still needs its K/V computed."""
        return self.num_computed_tokens < self.num_tokens - 1

    def num_blocks(self, block_size: int) -> int:
        return (self.num_tokens + block_size - 1) // block_size

