"""The agent's engine observer: each launched plan's shape, into the agent's metrics.

Observed where the plan is selected (before its forward is enqueued): rows and requests by
phase, distinct adapters, rank padding (`max_rank` x adapted rows / their true ranks), and
launches refused for a stale slot generation. It changes nothing about execution.
"""

from __future__ import annotations

from agent.metrics import AgentMetrics
from dataplane.core import BatchPlan, EngineError
from dataplane.engine.observer import EngineObserver


class PlanMetrics(EngineObserver):
    """Subscribe with ``engine.observers.append(PlanMetrics(metrics, max_rank))``."""

    def __init__(self, metrics: AgentMetrics, max_rank: int) -> None:
        self.metrics = metrics
        self.max_rank = max_rank

    def plan_launched(self, plan: BatchPlan, slot_ranks: dict[int, int]) -> None:
        m = self.metrics
        doff = plan.doff
        m.rows.labels("prefill").observe(doff)
        m.rows.labels("decode").observe(plan.num_rows - doff)
        m.requests_per_iter.labels("prefill").observe(plan.num_prefills)
        m.requests_per_iter.labels("decode").observe(plan.num_decodes)
        adapted = [s for s in plan.row_slot if s >= 0]
        m.distinct.observe(len(set(adapted)))
        true = sum(slot_ranks.get(s, 0) for s in adapted)
        if true:
            m.padding_ratio.set(len(adapted) * self.max_rank / true)

    def launch_refused(self, error: EngineError) -> None:
        self.metrics.slot_generation_mismatch.inc()
