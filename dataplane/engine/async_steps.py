"""Async scheduling: what one launched step carries, and how step N+1 reads N's tokens.

Control flow (Engine.step, async): launch step N (plan -> forward -> sampling enqueued,
no host sync); commit N's computed K/V and reserve one placeholder token per sampled
sequence (lengths +1); schedule and launch step N+1 while N still runs — decodes, next
prefill chunks and newly admitted requests (Scheduler.schedule_continuation); its
placeholder rows' input ids come from N's sampled-token device tensor, every other row's
ids are known; only then wait for N's tokens, replace the placeholders, apply stop rules
and return N's outputs. N+1 stays in flight across the call. When N+1 cannot be decided
yet (preemption would be needed, nothing continues with a row, a constrained request's
next mask needs N's token) nothing is launched early and the next call schedules
synchronously after N is applied.

K/V that N+1 reads and N writes (a prefill's earlier chunk, prefix-cache blocks N
completed) is ordered by the stream: N+1's work is enqueued after N's.

Correctness of a row whose request N finishes (stop token / string) or that is aborted
while in flight: its N+1 result is discarded (the scheduler skips finished sequences) and
its blocks were freed when it finished; the row's K/V write lands in such a freed block,
but every later writer or reader of that block is device work enqueued after N+1 on the
same stream, so the write is harmless. Requests that N finishes by length are known and
get no row.

Plan hooks (`Engine.on_plan_launched` / `on_plan_retired`): a launched step's plan is
retired once its tokens are applied, or when it is dropped (no live rows: every request
finished or was aborted), always after its forward and sampling were enqueued — so a
device event recorded in `on_plan_retired` marks the end of the plan's device work. In
the async loop two plans are open inside a `step()` call (N+1 launched before N is
applied) and N+1 stays open across it; retirement follows launch order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.core import BatchPlan, SequenceStatus
from dataplane.engine.deferred import DeferredTokens
from dataplane.engine.scheduler import ScheduleOutput
from dataplane.sampling.sampler import PendingSample


@dataclass
class Launched:
    """A step whose forward and sampling are enqueued; its tokens are in `pending`.

    `token` is what `Engine.on_plan_launched` returned for its plan; :func:`retire`
    hands it to `on_plan_retired` exactly once (`retired` records that), followed by
    `after`: tokens of continuation plans whose launch raised, retired right after this
    step so that retirement stays in launch order."""

    out: ScheduleOutput
    pending: PendingSample
    token: object = None
    scored: tuple[PendingSample, tuple[tuple[str, int], ...]] | None = None
    """Prompt logprobs of the plan's prompt-logprob rows and each row's (request id,
    position); None when no request in the step asked."""
    retired: bool = False
    after: list[object] = field(default_factory=list)


def retire(step: Launched, on_retired: Callable[[object], None]) -> None:
    """`on_retired(token)` for `step`, then for its `after` tokens (launch order); at most
    once per step, and every token is handed over even when an earlier call raises."""
    if step.retired:
        return
    step.retired = True
    tokens, step.after = [step.token, *step.after], []
    _each(tokens, on_retired)


def _each(tokens: list[object], fn: Callable[[object], None]) -> None:
    if tokens:
        try:
            fn(tokens[0])
        finally:
            _each(tokens[1:], fn)


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
