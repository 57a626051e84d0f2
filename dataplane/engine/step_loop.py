"""The engine's step loop, sync and async: launch a step, finish it, retire its plan.

`StepLoop` is the stepping half of `Engine` (engine.py holds construction, adapters and
requests). One step = scheduler.schedule() -> build_plan -> ModelRunner.execute (logits of
the sampled rows) -> Sampler -> scheduler commit/reserve/apply (docs/ENGINE_CONTRACT.md).
With async scheduling the next step is launched before this one's tokens reach the host;
async_steps.py describes that control flow, its correctness argument and the plan hook
(`on_plan_launched` / `on_plan_retired`) contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from dataplane.core import BatchPlan, InvalidRequest, Sequence, SequenceStatus
from dataplane.engine.async_steps import Launched, deferred_inputs, has_live_rows, retire
from dataplane.engine.deferred import DeferredTokens
from dataplane.engine.model_runner import ModelRunner
from dataplane.engine.request_output import RequestOutput
from dataplane.engine.scheduler import ScheduleOutput, Scheduler, StepUpdate
from dataplane.sampling.grammar import GrammarCompiler, GrammarState, allocate_bitmask
from dataplane.sampling.logits_processors import PendingTokens
from dataplane.sampling.sampler import PendingSample, Sampler, TokenLogprobs


class StepLoop:
    """Mixin: `step()` and the plan hooks over the attributes `Engine.__init__` sets."""

    scheduler: Scheduler
    runner: ModelRunner
    sampler: Sampler
    async_scheduling: bool
    last_step_idle: bool
    num_preemptions: int
    num_overlapped_steps: int
    num_discarded_rows: int
    _inflight: Launched | None
    _expired: list[RequestOutput]
    _seqs: dict[str, Sequence]
    _logprobs: dict[str, list[TokenLogprobs]]
    _prompt_logprobs: dict[str, list[TokenLogprobs]]
    _grammar: dict[str, GrammarState]

    if TYPE_CHECKING:
        def build_plan(self, out: ScheduleOutput) -> BatchPlan:
            """Engine.build_plan: the plan of one scheduled step."""
            ...

        def _forget(self, request_id: str) -> None:
            """Engine._forget: a request ended; drop it and its adapter hold."""
            ...

        def grammar_compiler(self) -> GrammarCompiler:
            """Engine.grammar_compiler: the structured-output compiler."""
            ...

        def abort(self, request_id: str) -> bool:
            """Engine.abort: cancel a live request."""
            ...

    # ----- plan hooks ------------------------------------------------------------------
    def on_plan_launched(self, plan: BatchPlan) -> object:
        """The launch fence and plan observers (both loops, sync and async; the engine
        implements it over its pool, engine.py).

        Called once per plan, after it is built and before its forward is enqueued
        (continuation plans too, whose decode input ids are still placeholders). The
        returned token goes to :meth:`on_plan_retired`. Raising refuses the launch:
        nothing is enqueued and no retire follows. Default: nothing (None)."""
        return None

    def on_plan_retired(self, token: object) -> None:
        """Hook: the plan that :meth:`on_plan_launched` returned `token` for is done.

        Called exactly once per token that `on_plan_launched` returned, in launch order,
        after the plan's forward and sampling were enqueued (or their launch raised) and
        either its tokens reached the host and were applied, or its rows were discarded
        (every request finished or was aborted) — also when the step raised. Device work
        of the plan is complete, or enqueued before anything recorded on the current
        stream now (e.g. a CUDA event marking the plan's last use of adapter slots)."""
        return None

    def _retire(self, step: Launched) -> None:
        """on_plan_retired for `step`, then for its failed followers; at most once."""
        retire(step, self.on_plan_retired)

    def _drop_inflight(self) -> None:
        """Forget the in-flight step (its results are not needed) and retire its plan."""
        step, self._inflight = self._inflight, None
        if step is not None:
            self._retire(step)

    def execute_plan(self, plan: BatchPlan, deferred: DeferredTokens | None) -> torch.Tensor:
        """The step's forward: logits of `plan.sample_rows` (the TP leader also hands the
        plan, and the deferred tokens, to its followers here)."""
        return self.runner.execute(plan, deferred)

    # ----- stepping -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; outputs for every request that got a token, after those
        of the requests dropped unstarted at their queue deadline (finish reason
        "deadline", no tokens).

        Async scheduling: the returned outputs are those of the oldest launched step; before
        waiting for its tokens the next step is launched (when the scheduler can decide it
        now), and it stays in flight across this call."""
        expired: list[RequestOutput] = []
        outputs = self._step(expired)
        return [*expired, *outputs] if expired else outputs

    def _step(self, expired: list[RequestOutput]) -> list[RequestOutput]:
        self._expired = expired
        if not self.async_scheduling:
            launched = self._schedule_and_launch()
            return [] if launched is None else self._finish_step(launched, None)
        cur, self._inflight = self._inflight, None
        if cur is not None and not has_live_rows(cur):
            self._retire(cur)  # every request in it finished or was aborted: nothing to apply
            cur = None
        if cur is None:
            cur = self._schedule_and_launch()
            if cur is None:
                return []
        self.last_step_idle = False
        return self._finish_step(cur, self._launch_continuation)

    def _schedule_and_launch(self) -> Launched | None:
        out = self.scheduler.schedule()
        self._report_expired(out)
        self.num_preemptions += len(out.preempted)
        self.last_step_idle = out.is_empty
        return None if out.is_empty else self._launch_step(out, None)

    def _report_expired(self, out: ScheduleOutput) -> None:
        """Outputs (no tokens, reason "deadline") of the requests the step dropped unstarted."""
        for seq in out.expired:
            self._expired.append(self._output(seq, (), ""))
            self._forget(seq.request_id)

    def _launch_step(self, out: ScheduleOutput, prev: Launched | None) -> Launched:
        """Build the plan, enqueue the forward and the sampling; no host sync. With `prev`
        (still in flight, tokens reserved) its sampled tokens feed the placeholder rows."""
        plan = self.build_plan(out)
        if [s.request_id for s in out.sampled] != list(plan.sample_request_ids):
            raise InvalidRequest("plan sample order differs from the scheduler's")
        token = self.on_plan_launched(plan)
        try:
            deferred = None if prev is None else deferred_inputs(plan, out, prev)
            logits = self.execute_plan(plan, deferred)
            n = len(plan.sample_rows)
            pending = self.sampler.launch(
                logits[:n] if plan.prompt_logprob_rows else logits, out.sampled,
                None if prev is None else PendingTokens(prev.pending.tokens, prev.out.sampled),
                self._grammar_masks(out.sampled) if self._grammar else None)
            scored = self._score_prompts(plan, logits[n:]) if plan.prompt_logprob_rows else None
        except BaseException:
            if prev is None:
                self.on_plan_retired(token)
            else:
                prev.after.append(token)  # retired right after `prev`: launch order
            raise
        return Launched(out, pending, token, scored=scored)

    def _grammar_masks(self, sampled: list[Sequence]) -> tuple[torch.Tensor, list[int]] | None:
        """(host bitmask, rows) of the sampled rows whose request has a response_format:
        each row's allowed next tokens given the tokens its grammar accepted."""
        rows = [i for i, s in enumerate(sampled) if s.request_id in self._grammar]
        if not rows:
            return None
        compiler = self.grammar_compiler()
        bitmask = allocate_bitmask(len(rows), compiler.vocab_size)
        compiler.fill_bitmasks(bitmask, [self._grammar[sampled[i].request_id] for i in rows])
        return bitmask, rows

    def _accept_grammar(self, updates: list[StepUpdate]) -> list[str]:
        """Advance each constrained request's grammar by its new token; the requests whose
        token the grammar refused (never expected: the mask allowed it), to abort."""
        refused = []
        for u in updates:
            state = self._grammar.get(u.seq.request_id)
            if state is not None and not u.finished and not state.accept(u.token_id):
                refused.append(u.seq.request_id)
        return refused

    def _score_prompts(self, plan: BatchPlan, logits: torch.Tensor
                       ) -> tuple[PendingSample, tuple[tuple[str, int], ...]]:
        """Enqueue the prompt logprobs of `plan.prompt_logprob_rows` (logits in that order):
        the row at position p scores prompt token p + 1."""
        where = tuple((plan.request_ids[plan.row_request[r]], plan.positions[r])
                      for r in plan.prompt_logprob_rows)
        seqs = [self._seqs[rid] for rid, _ in where]
        targets = [seq.token_ids[pos + 1] for seq, (_, pos) in zip(seqs, where, strict=True)]
        top = [seq.sampling.prompt_logprobs or 0 for seq in seqs]
        return self.sampler.score(logits, targets, top), where

    def _apply_prompt_logprobs(self, step: Launched) -> None:
        """Append each scored prompt token to its request's list, in position order (a
        position scored again after a preemption is already there)."""
        if step.scored is None:
            return
        pending, where = step.scored
        for (rid, pos), lp in zip(where, pending.result().logprobs, strict=True):
            got = self._prompt_logprobs.get(rid)
            if got is not None and lp is not None and pos == len(got):
                got.append(lp)

    def _launch_continuation(self, cur: Launched) -> None:
        """After `cur` is committed and reserved: launch the next step if it is decidable
        (not while a constrained request decodes: its next mask needs `cur`'s token)."""
        if self._grammar and any(s.request_id in self._grammar for s in cur.out.sampled):
            return
        nxt = self.scheduler.schedule_continuation(cur.out)
        if nxt is not None:
            self._report_expired(nxt)
            self._inflight = self._launch_step(nxt, cur)
            self.num_overlapped_steps += 1

    def _finish_step(self, cur: Launched, overlap: Callable[[Launched], None] | None
                ) -> list[RequestOutput]:
        """Commit `cur`, run `overlap` (launch the next step) while it computes, then wait
        for its tokens, apply them and build the outputs. `cur`'s plan is retired once its
        tokens are applied, or when this raises."""
        dropped: Launched | None = None
        try:
            self.scheduler.commit_computed(cur.out)
            self.scheduler.reserve_tokens(cur.out)
            if overlap is not None:
                try:
                    overlap(cur)
                except Exception:
                    # `cur` is applied below; the next step re-plans
                    dropped, self._inflight = self._inflight, None
                    self.scheduler.apply_tokens(cur.out, cur.pending.result().token_ids)
                    raise
            result = cur.pending.result()
            self._apply_prompt_logprobs(cur)
            updates = self.scheduler.apply_tokens(cur.out, result.token_ids)
            refused = self._accept_grammar(updates) if self._grammar else []
        finally:
            try:
                self._retire(cur)
            finally:
                if dropped is not None:
                    self._retire(dropped)
        if self._inflight is not None:
            self.num_discarded_rows += sum(s.is_finished for s in self._inflight.out.decodes)
            if not has_live_rows(self._inflight):
                self._drop_inflight()
        by_id = ({s.request_id: lp
                  for s, lp in zip(cur.out.sampled, result.logprobs, strict=True)}
                 if any(lp is not None for lp in result.logprobs) else None)
        outputs = []
        output = self._output
        for u in updates:
            seq = u.seq
            if by_id is not None:
                lp = by_id.get(seq.request_id)
                if lp is not None:
                    self._logprobs[seq.request_id].append(lp)
            outputs.append(output(seq, (u.token_id,), u.text))
            if u.finished:
                self._forget(seq.request_id)
        for rid in refused:
            seq = self._seqs[rid]
            self.abort(rid)
            outputs.append(self._output(seq, (), ""))
        return outputs

    def _output(self, seq: Sequence, new_ids: tuple[int, ...], new_text: str) -> RequestOutput:
        """The request's output after this step (built for every row of every step, so its
        fields are passed positionally, in RequestOutput's field order: binding twelve
        keywords costs about three times the construction)."""
        rid, sampling, reason, tokens = (seq.request_id, seq.sampling, seq.finish_reason,
                                         seq.token_ids)
        return RequestOutput(
            rid, seq.prompt_token_ids, tokens, len(tokens), new_ids, seq.output_text,
            new_text, seq.status is SequenceStatus.FINISHED,
            None if reason is None else reason.value,
            None if sampling.logprobs is None else tuple(self._logprobs.get(rid, ())),
            seq.num_cached_tokens,
            0 if seq.adapter_digest is None or seq.active_from == 0
            else self._cached_base_tokens(seq),
            None if sampling.prompt_logprobs is None
            else tuple(self._prompt_logprobs.get(rid, ())))

    def _cached_base_tokens(self, seq: Sequence) -> int:
        """Cached prompt tokens of an adapter request in blocks keyed by base execution:
        the full blocks before its activation offset (0 for base and plain LoRA)."""
        if seq.adapter_digest is None or seq.active_from == 0:
            return 0
        bs = self.scheduler.block_manager.block_size
        return min(seq.num_cached_tokens, seq.active_from // bs * bs)
