"""Continuous-batching scheduler: token/sequence budgets, chunked prefill, fairness, preemption.

Torch-free. One `schedule()` per engine step picks rows in this order:
  1. one decode row for every running request whose prompt is fully computed (in admission
     order), growing its block table; when KV blocks run out a running request is preempted
     by recompute (blocks freed, back to the front of the waiting queue): under the `fair`
     policy the one of the least urgent class whose tenant has the most service per weight
     (latest admitted among them), under `fcfs` the latest admitted;
  2. the next chunk of running requests that are still in (chunked) prefill;
  3. waiting requests, admitted while blocks, `max_num_seqs` and the token budget allow, in
     the policy's order (`fair`: the tenant key of dataplane/engine/fairness.py; `fcfs`:
     arrival; `newest_first`: `fair`, but the newest first within a priority class while
     requests arrive faster than they are admitted, engine/overload.py); a long prompt is
     split into chunks across steps. Admission leaves `load_reservation` blocks free
     for adapter loads that waited too long. The fair key after the tenant's service is the
     request's age in scheduling rounds, then the adapter cost vector (fairness.py
     `AdapterCost`: among requests queued in the same round, one whose adapter already
     has rows in the step adds no run), then arrival and id. When the next request's
     blocks do not fit, admission stops (no smaller request overtakes it), except when
     nothing runs (nothing would ever free blocks): then the first ready request that fits
     is admitted, so pages held by queued requests' adapters cannot stall the engine. A round with a
     free seat keys the ready waiting requests once (`_Candidates`: a heap; an admission
     re-keys only the requests on its adapter), so a deep queue costs O(W log W) per
     such round, not per admitted request.
Before admission, waiting requests that were never admitted and carry a queue deadline
(`Sequence.queue_deadline`) are dropped unstarted (`ScheduleOutput.expired`,
FinishReason.DEADLINE) when the deadline has passed, or when the estimated wait for their
prefill already exceeds it (early abort): the prompt tokens ahead of it in admission
order, over the step's token budget, times the recent step interval. `counts` keeps the
offered / admitted / expired ledger.
Requests whose adapter is not ready (`adapter_ready(seq)` is False) get no rows and do not
block the requests behind them. Completed work is credited to the request's tenant when
the step is committed (`tenants`, fairness.py). The scheduler never touches model rows or
tensors: the engine builds a `BatchPlan` from the `ScheduleOutput`, runs the model,
samples, then calls `postprocess` with one token per `ScheduleOutput.sampled` sequence.

`ScheduleOutput` and `StepUpdate` live in schedule_output.py (re-exported here).

Async scheduling (engine/step_loop.py) splits `postprocess` into its three phases so that
the next step can be scheduled while this one still runs: `commit_computed` (K/V of the
step's rows counts as computed), `reserve_tokens` (a PLACEHOLDER_TOKEN per sampled
sequence: lengths +1), then `schedule_continuation` (the next step: decodes, prefill
chunks and admissions, or None when only the synchronous scheduler can decide it), and
finally `apply_tokens` once the tokens are on the host (placeholders replaced, stop rules,
finished requests freed).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import Protocol

from dataplane.core import (
    PLACEHOLDER_TOKEN,
    EngineError,
    InvalidRequest,
    Sequence,
    SequenceStatus,
)
from dataplane.engine.fairness import POLICIES, AdapterCost, TenantLedger
from dataplane.engine.overload import RateMeter, can_start_in_time, overloaded
from dataplane.engine.schedule_output import ScheduleOutput, StepUpdate
from dataplane.kvcache import BlockManager
from dataplane.sampling.stop_checker import StopChecker

__all__ = [
    "Detokenizer",
    "ScheduleOutput",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepUpdate",
]


class SchedulerError(EngineError):
    """The engine called the scheduler inconsistently (e.g. wrong number of sampled tokens)."""

    code = "SCHEDULER_ERROR"


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str:
        """Append one generated token; return the newly final text (may be empty)."""
        ...

    def flush(self) -> str:
        """Return any text still held back; called once when the request finishes."""
        ...


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets and the admission policy ("fair" | "fcfs" | "newest_first").
    `max_model_len` bounds prompt + output tokens (None: unbounded)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int | None = None
    policy: str = "fair"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidRequest(f"scheduling policy must be one of {POLICIES}",
                                 policy=str(self.policy))
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"{name} must be an int >= 1", **{name: value})
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequest("max_model_len must be >= 2", max_model_len=self.max_model_len)


class _Candidates:
    """One admission round's ready requests, best first by `key`, with `key` evaluated
    once per request and round instead of once per request and admission. Admitting a
    request puts its adapter in the step, which lowers the adapter cost (one run fewer)
    of the other requests on that adapter, and nothing else in the key moves during a
    round: `activated(slot)` re-queues those requests under their new key, and the copy
    under the old key is skipped when it surfaces."""

    def __init__(self, ready: list[Sequence],
                 key: Callable[[Sequence], tuple[object, ...]]) -> None:
        self._ready, self._key = ready, key
        self._heap = [(key(s), i) for i, s in enumerate(ready)]
        heapq.heapify(self._heap)
        self._by_slot: dict[int, list[int]] = {}
        for i, seq in enumerate(ready):
            self._by_slot.setdefault(seq.adapter_slot, []).append(i)
        self._taken: set[int] = set()

    def pop(self) -> Sequence | None:
        """The best remaining request (it leaves the round), or None."""
        while self._heap:
            _, i = heapq.heappop(self._heap)
            if i not in self._taken:
                self._taken.add(i)
                return self._ready[i]
        return None

    def activated(self, slot: int) -> None:
        """The step now has rows on `slot`: re-key the requests on it."""
        for i in self._by_slot.pop(slot, ()):
            if i not in self._taken:
                heapq.heappush(self._heap, (self._key(self._ready[i]), i))


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        *,
        eos_token_ids: Iterable[int] = (),
        adapter_ready: Callable[[Sequence], bool] | None = None,
        detokenizer_factory: Callable[[Sequence], Detokenizer] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.adapter_ready = adapter_ready or (lambda _seq: True)
        self.detokenizer_factory = detokenizer_factory
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._stops: dict[str, StopChecker] = {}
        self._arrivals = 0
        self.tenants = TenantLedger()
        """Tenant weights, priority classes and completed service (fairness.py)."""
        self._fair = config.policy != "fcfs"
        self._newest_under_overload = config.policy == "newest_first"
        self.arrival_rate, self.admission_rate = RateMeter(), RateMeter()
        """Moving rates of requests added and admitted (the overload test)."""
        self.clock = clock
        self.step_interval: float | None = None
        """Moving average of the time from a step that had work to the next `schedule()`
        (under async scheduling, between admission rounds): the wait estimate's unit."""
        self._last_step: float | None = None
        self.counts = {"offered": 0, "admitted": 0, "expired": 0}
        """Requests added, admitted (first scheduled), and dropped at their deadline."""
        self.load_reservation = 0
        """Obtainable KV blocks that admission leaves free for adapter loads that waited
        too long (engine/prefetch.py): running requests' growth may still use them."""
        self.rounds = 0
        """`schedule()` calls so far: a request's age is the rounds since it was queued."""
        self._active: set[int] = set()
        """Adapter slots with rows in the step being scheduled (the cost vector's runs)."""

    # ----- requests -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a fresh request (InvalidRequest / KVCapacityError: nothing changes)."""
        rid = seq.request_id
        if rid in self._stops:
            raise InvalidRequest("duplicate request id", request_id=rid)
        if seq.status is not SequenceStatus.WAITING or seq.num_output_tokens or seq.block_table:
            raise InvalidRequest("only fresh sequences can be added", request_id=rid)
        if seq.sampling.stop and self.detokenizer_factory is None:
            raise InvalidRequest("stop strings need a tokenizer", request_id=rid)
        limit = self.config.max_model_len
        if limit is not None and seq.num_prompt_tokens >= limit:
            raise InvalidRequest("prompt does not fit max_model_len", request_id=rid,
                                 prompt_tokens=seq.num_prompt_tokens, max_model_len=limit)
        self.block_manager.check_request(seq, self._max_len(seq))
        detok = self.detokenizer_factory(seq) if self.detokenizer_factory else None
        self._stops[rid] = StopChecker(seq, self.eos_token_ids, detok, self._max_len(seq))
        seq.arrival = self._arrivals
        seq.arrival_round = self.rounds
        self._arrivals += 1
        self.tenants.enter(seq.tenant)
        self.counts["offered"] += 1
        self.arrival_rate.add(self.clock())
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Cancel a request: free its blocks, mark it finished (abort). None if not live."""
        for seq in [*self.running, *self.waiting]:
            if seq.request_id == request_id:
                if seq in self.running:
                    self.running.remove(seq)
                else:
                    self.waiting.remove(seq)
                self._stops.pop(request_id).abort()
                self.block_manager.deallocate(seq)
                self._ended(seq)
                return seq
        return None

    def _ended(self, seq: Sequence) -> None:
        self.tenants.leave(seq.tenant)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def committed_kv_growth(self) -> int:
        """KV blocks the running requests may still grow into (each up to its maximum
        length): pages a load must leave free (engine/prefetch.py `load_budget`)."""
        bm = self.block_manager
        return sum(max(0, bm.blocks_for(self._max_len(s)) - len(s.block_table))
                   for s in self.running)

    def _max_len(self, seq: Sequence) -> int:
        total = seq.num_prompt_tokens + seq.sampling.max_tokens
        limit = self.config.max_model_len
        return total if limit is None else min(total, limit)

    # ----- scheduling ---------------------------------------------------------------------
    def _preempt(self, seq: Sequence, out: ScheduleOutput) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _victim(self, first: int) -> Sequence:
        """The running request to preempt (module docstring, step 1), among those from
        index `first` on (the ones before it have their decode row in this step)."""
        if not self._fair:
            return self.running[-1]
        t = self.tenants
        return max(reversed(self.running[first:]),
                   key=lambda s: (t.priority(s.tenant), t.normalized(s.tenant)))

    def _admission_key(self, seq: Sequence) -> tuple[object, ...]:
        t = self.tenants
        return (t.priority(seq.tenant), t.normalized(seq.tenant), seq.arrival_round,
                self._cost(seq), seq.arrival, seq.request_id)

    def _cost(self, seq: Sequence) -> AdapterCost:
        """The adapter cost of admitting `seq` now: it is ready, so nothing to load and no
        new pages; a new run unless its adapter already has rows in the batch; its rank
        (the paged pool stores the true rank: nothing padded)."""
        new_run = 0 if seq.adapter_slot in self._active else 1
        return AdapterCost(0, new_run, seq.adapter_rank, seq.adapter_rank, 0)

    def _newest_key(self, seq: Sequence) -> tuple[object, ...]:
        return (self.tenants.priority(seq.tenant), -seq.arrival, seq.request_id)

    def overloaded(self, now: float) -> bool:
        """Requests arrive faster than they are admitted (engine/overload.py)."""
        return overloaded(self.arrival_rate.rate(now), self.admission_rate.rate(now))

    def _order(self, now: float) -> Callable[[Sequence], tuple[object, ...]]:
        """This round's admission key (policies other than fcfs)."""
        if self._newest_under_overload and self.waiting and self.overloaded(now):
            return self._newest_key
        return self._admission_key

    def _candidates(self, now: float) -> _Candidates:
        """This round's ready waiting requests in the policy's order (policies other than
        fcfs)."""
        return _Candidates([s for s in self.waiting if self.adapter_ready(s)], self._order(now))

    def _next_fcfs(self, skipped: list[Sequence]) -> Sequence | None:
        """The first waiting request whose adapter is ready, still in `waiting`; the
        not-ready ones it passes move to `skipped`."""
        while self.waiting:
            if self.adapter_ready(self.waiting[0]):
                return self.waiting[0]
            skipped.append(self.waiting.popleft())
        return None

    def _note_step(self, now: float) -> None:
        """The time since the previous step, when that step had work, feeds the average."""
        if self._last_step is not None:
            gap = now - self._last_step
            self.step_interval = gap if self.step_interval is None else (
                0.8 * self.step_interval + 0.2 * gap)

    def _expire(self, now: float, out: ScheduleOutput) -> None:
        """Drop the waiting requests that cannot be admitted by their deadline (module
        docstring), in admission order."""
        if not any(s.queue_deadline is not None for s in self.waiting):
            return
        order = (sorted(self.waiting, key=self._order(now)) if self._fair
                 else list(self.waiting))
        per_step, interval = self.config.max_num_batched_tokens, self.step_interval or 0.0
        ahead = 0
        for seq in order:
            fresh = seq.status is SequenceStatus.WAITING and seq.num_computed_tokens == 0
            if fresh and not can_start_in_time(seq.queue_deadline, now,
                                               (ahead // per_step) * interval):
                self.waiting.remove(seq)
                self._stops.pop(seq.request_id).expire()
                self._ended(seq)
                self.counts["expired"] += 1
                out.expired.append(seq)
                continue
            ahead += seq.num_tokens - seq.num_computed_tokens

    def _begin_step(self, now: float, out: ScheduleOutput) -> None:
        """What every scheduled step starts with: a round, the step clock, expiries."""
        self.rounds += 1
        self._active = {s.adapter_slot for s in self.running}
        self._note_step(now)
        self._expire(now, out)

    def schedule(self) -> ScheduleOutput:
        out = ScheduleOutput()
        now = self.clock()
        self._begin_step(now, out)
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager
        # 1. decodes, preempting from the back of `running` when blocks run out
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.in_prefill or not self.adapter_ready(seq):
                i += 1
                continue
            if bm.blocks_needed(seq) == 0:  # the common decode step: no block to add
                out.decodes.append(seq)
                budget -= 1
                i += 1
                continue
            while not bm.can_append(seq):
                self._preempt(self._victim(i), out)
                if seq not in self.running:
                    break
            else:
                bm.may_append(seq)
                out.decodes.append(seq)
                budget -= 1
                i += 1
        self._prefill_and_admit(out, budget, now, ending=0)
        if not self.running and self.waiting and budget > 0 and not out.preempted:
            # Liveness: nothing runs (so nothing will free blocks) and the first request
            # in order does not fit, e.g. pool pages held by the adapters of requests that
            # wait behind it: admit the first ready one that fits; the head follows once
            # those finish and their adapters can be evicted.
            fits = next((s for s in self.waiting if self.adapter_ready(s)
                         and bm.can_allocate(s, keep=self.load_reservation)), None)
            if fits is not None:
                self._admit(fits, out, budget, now, None)
        return self._sampled(out, now)

    def _prefill_and_admit(self, out: ScheduleOutput, budget: int, now: float,
                           ending: int, prefill_due: bool = True) -> None:
        """Steps 2 and 3 of a step, after its decodes: the next chunks of running
        prefills (none when not `prefill_due`), then waiting requests admitted in the
        policy's order among the ready ones (none in a step that preempted). `ending`:
        running requests that will have finished before this step runs (their seats
        count as free)."""
        bm = self.block_manager
        # 2. next chunks of running prefills
        for seq in self.running if prefill_due else ():
            if budget == 0:
                break
            if seq.in_prefill and self.adapter_ready(seq):
                n = min(seq.num_tokens - seq.num_computed_tokens, budget)
                out.prefills.append((seq, n))
                budget -= n
        # 3. admissions
        seats = self.config.max_num_seqs + ending
        skipped: list[Sequence] = []
        fair = self._candidates(now) if (
            self._fair and self.waiting and budget > 0 and not out.preempted
            and len(self.running) < seats) else None
        while (self.waiting and budget > 0 and not out.preempted
               and len(self.running) < seats):
            nxt = fair.pop() if fair is not None else self._next_fcfs(skipped)
            if nxt is None or not bm.can_allocate(nxt, keep=self.load_reservation):
                break
            budget -= self._admit(nxt, out, budget, now, fair)
        self.waiting.extendleft(reversed(skipped))

    def _sampled(self, out: ScheduleOutput, now: float) -> ScheduleOutput:
        """`out` with its sampled sequences: prefills that reach their end, then decodes."""
        out.sampled = [s for s, n in out.prefills if s.num_computed_tokens + n == s.num_tokens]
        out.sampled.extend(out.decodes)
        self._last_step = None if out.is_empty else now
        return out

    def schedule_continuation(self, prev: ScheduleOutput) -> ScheduleOutput | None:
        """The step after `prev`, scheduled while `prev` still runs on the device.

        Call after `commit_computed(prev)` and `reserve_tokens(prev)` (each sequence `prev`
        samples holds a placeholder, its input in this step). Mirrors `schedule()`
        assuming every sampled sequence continues, except those that `prev` finishes by
        length (known now): no row, and their seats count as free. Decodes, the next
        chunks of running prefills and admissions of waiting requests, as `schedule()`
        orders them; an admission fits in the blocks free now (the finishing requests'
        blocks are still `prev`'s), so it may wait a step longer than the synchronous
        scheduler would let it. Returns None and changes nothing when the synchronous
        scheduler must decide: too few free KV blocks for every decode (preemption), or no
        running request continues with a row. A sequence that `prev` finishes by a stop
        token / string keeps its row; its result is discarded (`postprocess` /
        `apply_tokens` skip finished sequences) and its blocks, the one appended here
        included, are freed when it finishes."""
        running = SequenceStatus.RUNNING
        if any(s.status is running and s.token_ids[-1] != PLACEHOLDER_TOKEN
               for s in prev.sampled):
            raise SchedulerError("schedule_continuation needs reserve_tokens(prev) first")
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager
        decodes: list[Sequence] = []
        growing: list[Sequence] = []  # decodes whose table needs a block
        ending, prefill_due, need = 0, False, 0
        # per running request, every step, so its counts are read once: its length rule
        # (StopChecker's: max_tokens or the model length), in_prefill, blocks_needed
        limit, ready, blocks_for = self.config.max_model_len, self.adapter_ready, bm.blocks_for
        for seq in self.running:
            n = len(seq.token_ids)
            last = len(seq.prompt_token_ids) + seq.sampling.max_tokens
            if n >= (last if limit is None else min(last, limit)):
                ending += 1  # `prev` finishes it by length
            elif not ready(seq):
                continue
            elif seq.num_computed_tokens < n - 1:
                prefill_due = True
            elif len(decodes) < budget:
                decodes.append(seq)
                grow = blocks_for(n) - len(seq.block_table)
                if grow > 0:
                    growing.append(seq)
                    need += grow
        if not decodes and not prefill_due:
            return None  # nothing continues with a row: the synchronous step decides
        if not bm.can_take(need):
            return None  # the synchronous step would preempt
        out = ScheduleOutput()
        now = self.clock()
        self._begin_step(now, out)
        for seq in growing:
            bm.may_append(seq)
        out.decodes = decodes
        self._prefill_and_admit(out, budget - len(decodes), now, ending, prefill_due)
        return self._sampled(out, now)

    def _admit(self, seq: Sequence, out: ScheduleOutput, budget: int, now: float,
               fair: _Candidates | None) -> int:
        """Move a waiting request to running with its first prefill chunk; the chunk's
        tokens (taken from `budget`)."""
        self.waiting.remove(seq)
        if seq.status is SequenceStatus.WAITING:
            self.counts["admitted"] += 1
            self.admission_rate.add(now)
        self.block_manager.allocate(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if seq.adapter_slot not in self._active:
            self._active.add(seq.adapter_slot)
            if fair is not None:
                fair.activated(seq.adapter_slot)
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        out.prefills.append((seq, n))
        return n

    # ----- after the model ran --------------------------------------------------------------
    def postprocess(self, out: ScheduleOutput, token_ids: SequenceOf[int]) -> list[StepUpdate]:
        """Record computed K/V, append one sampled token per `out.sampled` sequence, apply stop
        rules, free finished requests. Aborted-in-between requests are skipped."""
        self._check_count(out, token_ids)
        self.commit_computed(out)
        self.reserve_tokens(out)
        return self.apply_tokens(out, token_ids)

    @staticmethod
    def _check_count(out: ScheduleOutput, token_ids: SequenceOf[int]) -> None:
        if len(token_ids) != len(out.sampled):
            raise SchedulerError("one sampled token per sampled sequence is required",
                                 expected=len(out.sampled), got=len(token_ids))

    def commit_computed(self, out: ScheduleOutput) -> None:
        """The step's rows' K/V count as computed (full blocks are offered to the prefix
        cache: they are read only by later device work, which the stream orders after)."""
        running, cache_blocks = SequenceStatus.RUNNING, self.block_manager.cache_computed_blocks
        for seq, n in out.prefills:
            if seq.status is running:
                seq.num_computed_tokens += n
                cache_blocks(seq)
                self.tenants.credit(seq.tenant, input_tokens=n)
        for seq in out.decodes:
            if seq.status is running:
                seq.num_computed_tokens += 1
                cache_blocks(seq)

    def reserve_tokens(self, out: ScheduleOutput) -> None:
        """Append a PLACEHOLDER_TOKEN to every running sampled sequence (after commit)."""
        for seq in out.sampled:
            if seq.status is SequenceStatus.RUNNING:
                seq.token_ids.append(PLACEHOLDER_TOKEN)

    def apply_tokens(self, out: ScheduleOutput, token_ids: SequenceOf[int]) -> list[StepUpdate]:
        """Replace each running sampled sequence's placeholder by its token (in `sampled`
        order), apply stop rules, free finished requests; aborted sequences are skipped."""
        self._check_count(out, token_ids)
        updates: list[StepUpdate] = []
        running, done, stops = SequenceStatus.RUNNING, SequenceStatus.FINISHED, self._stops
        generated: dict[str, int] = {}  # tenant -> tokens: credited once per step
        try:
            for seq, token in zip(out.sampled, token_ids, strict=True):
                if seq.status is not running:
                    continue
                ids = seq.token_ids
                if ids[-1] != PLACEHOLDER_TOKEN:
                    raise SchedulerError("apply_tokens without reserve_tokens",
                                         request_id=seq.request_id)
                token = int(token)
                ids[-1] = token
                generated[seq.tenant] = generated.get(seq.tenant, 0) + 1
                text = stops[seq.request_id].on_token(token)
                finished = seq.status is done
                updates.append(StepUpdate(seq, token, text, finished))
                if finished:
                    del stops[seq.request_id]
                    self.running.remove(seq)
                    self.block_manager.deallocate(seq)
                    self._ended(seq)
        finally:
            for tenant, n in generated.items():
                self.tenants.credit(tenant, output_tokens=n)
        return updates
