"""Async scheduling: what one launched step carries, and how step N+1 reads N's tokens.

Control flow (Engine.step, async): launch step N (plan -> forward -> sampling enqueued,
no host sync); commit N's computed K/V and reserve one placeholder token per sampled
sequence (lengths +1); schedule and launch the decode-only step N+1 while N still runs —
its placeholder rows' input ids come from N's sampled-token device tensor; only then wait
for N's tokens, replace the placeholders, apply stop rules and return N's outputs. N+1
stays in flight across the call. When N+1 cannot be decided yet (a prefill is due, a
request could be admitted, preemption would be needed) nothing is launched early and the
next call schedules synchronously after N is applied.

Correctness of a row whose request N finishes (stop token / string) or that is aborted
while in flight: its N+1 result is discarded (the scheduler skips finished sequences) and
its blocks were freed when it finished; the row's K/V write lands in such a freed block,
but every later writer or reader of that block is device work enqueued after N+1 on the
same stream, so the write is harmless. Requests that N finishes by length are known and
get no row.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.core import BatchPlan, SequenceStatus
from dataplane.engine.deferred import DeferredTokens
from dataplane.engine.scheduler import ScheduleOutput
from dataplane.sampling.sampler import PendingSample


@dataclass
class Launched:
    """A step whose forward and sampling are enqueued; its tokens are in `pending`."""

    out: ScheduleOutput
    pending: PendingSample


def has_live_rows(step: Launched) -> bool:
    """True while some request of the step is still running (its result matters)."""
    running = SequenceStatus.RUNNING
    return (any(s.status is running for s in step.out.decodes)
            or any(s.status is running for s, _ in step.out.prefills))


def deferred_inputs(plan: BatchPlan, out: ScheduleOutput, prev: Launched) -> DeferredTokens:
    """Placeholder decode rows of `plan` (built from `out`) <- `prev`'s sampled tokens.

    Decode j of `out` is packed row plan.doff + j; it reads prev's token k when its sequence
    is prev's k-th sampled sequence (the one whose last token is the placeholder)."""
    index = {id(s): k for k, s in enumerate(prev.out.sampled)}
    src: list[int] = []
    dst: list[int] = []
    for j, seq in enumerate(out.decodes):
        k = index.get(id(seq))
        if k is not None:
            src.append(k)
            dst.append(plan.doff + j)
    return DeferredTokens(prev.pending.tokens, tuple(src), tuple(dst))
