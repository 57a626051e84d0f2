"""What one scheduler step decided (`ScheduleOutput`) and what each sampled token did
(`StepUpdate`). Torch-free records shared by the scheduler, the engine's step loop and the
async-scheduling helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.core import Sequence


@dataclass
class ScheduleOutput:
    """Rows chosen for one step. `prefills` are (seq, num_new_tokens) chunks starting at
    seq.num_computed_tokens; `decodes` contribute one row each. Scheduler order is prefills
    then decodes. `sampled` (fixed when the step is scheduled) lists the sequences that get a
    token this step, in that order: prefill chunks that reach the end of their tokens, then
    every decode — the same order as BatchPlan.sample_request_ids. `expired` are waiting
    requests dropped unstarted this step: their queue deadline passed, or the estimated wait
    for their prefill can no longer meet it (scheduler.py)."""

    prefills: list[tuple[Sequence, int]] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    sampled: list[Sequence] = field(default_factory=list)
    expired: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.prefills) + len(self.decodes)


@dataclass(slots=True)
class StepUpdate:
    """What one sampled token did to its request; `text` is the new streamable text.
    One per row per step: a plain slotted class (cheaper to build than a frozen one)."""

    seq: Sequence
    token_id: int
    text: str
    finished: bool
