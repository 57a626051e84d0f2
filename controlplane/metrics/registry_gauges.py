"""Gauges read from the registry's rows at scrape time: jobs, agents, propagation.

One scrape costs a bounded number of statements: one per job kind (an aggregate over the
rows in a busy state), one over the agents table (one row per agent), the catalog's
change counter, and one index lookup per distinct catalog version that live agents
report behind the counter (usually none or one). Nothing is cached: a value is as fresh
as the scrape.

- Jobs are the rows the worker still owes a result: artifacts `pending`/`validating`,
  collections `pending`/`fitting` (the states the reaper watches, worker/reaper.py). Age
  is from the row's creation (the push or the fit request), retries included: what the
  caller has been waiting.
- Agents by state are `agent_state()`'s (the `state` of `GET /v1/agents`). Heartbeat age
  and propagation lag are per agent name, for agents not asked to drain: draining is how
  an agent leaves (the Kubernetes preStop hook drains it), so a drained agent that went
  away is no alarm, and draining a dead agent's name is how an operator retires it.
- Propagation lag: an agent reports the catalog version it applied (`catalog_version`,
  the newest generation row's id when it fetched desired state). Its lag is the age of
  the oldest generation it has not applied yet (0 when it is current), counted for live
  agents that have reported since they registered; a stale agent's silence is the
  heartbeat age's to report.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.agents.service import agent_state
from controlplane.kit.failures import DATABASE_DOWN
from controlplane.models import Agent, CatalogGeneration, utcnow
from controlplane.worker.reaper import JOB_KINDS

AGENT_STATES = ("live", "draining", "drained", "stale")


class RegistryCollector:
    """A Prometheus collector over the database (see module doc)."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.session_factory = session_factory

    def describe(self) -> list[Metric]:
        return []  # families are built at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("adapterplane_database_up", "1 when this scrape could read "
                               "the registry database, else 0 (the row-derived gauges are "
                               "then absent).")
        try:
            with self.session_factory() as session:
                families = list(_read(session, utcnow()))
        except DATABASE_DOWN:  # still an answer: the request metrics and `up` 0
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families


def _read(session: Session, now: datetime) -> Iterator[Metric]:
    queued = GaugeMetricFamily("adapterplane_jobs_queued", "Registry rows a worker job "
                               "still owes a result, by kind (artifact validation, "
                               "collection fit) and state.", labels=["kind", "state"])
    oldest = GaugeMetricFamily("adapterplane_jobs_oldest_queued_age_seconds", "Age of the "
                               "oldest row still waiting for its job, by kind (0: none).",
                               labels=["kind"])
    for kind in JOB_KINDS:
        model = kind.model
        rows = session.execute(
            select(model.state, func.count(), func.min(model.created_at))
            .where(model.state.in_(kind.busy_states)).group_by(model.state)).all()
        counts = {str(state): int(n) for state, n, _ in rows}
        for state in kind.busy_states:
            queued.add_metric([kind.noun, state], counts.get(state, 0))
        first = min((created for _, _, created in rows if created is not None), default=None)
        oldest.add_metric([kind.noun], 0 if first is None else _seconds(now, first))
    yield queued
    yield oldest
    yield from _agents(session, now)


def _agents(session: Session, now: datetime) -> Iterator[Metric]:
    agents = session.scalars(select(Agent).order_by(Agent.id)).all()
    version = int(session.scalar(select(func.max(CatalogGeneration.id))) or 0)
    states = dict.fromkeys(AGENT_STATES, 0)
    heartbeat = GaugeMetricFamily("adapterplane_agent_heartbeat_age_seconds", "Seconds "
                                  "since each agent not asked to drain last reported "
                                  "(registration or heartbeat).", labels=["agent"])
    lag = GaugeMetricFamily("adapterplane_agent_catalog_lag_seconds", "Per live agent not "
                            "asked to drain: age of the oldest catalog change (publish, "
                            "retire, rollback) it has not applied (0: current).",
                            labels=["agent"])
    published_at: dict[int, datetime | None] = {}
    for agent in agents:
        state = agent_state(agent)
        states[state] += 1
        if agent.drain:
            continue
        heartbeat.add_metric([agent.name], _seconds(
            now, agent.last_heartbeat_at or agent.registered_at))
        if state != "live" or agent.last_heartbeat_at is None:
            continue
        behind = agent.catalog_version
        if behind >= version:
            lag.add_metric([agent.name], 0)
            continue
        if behind not in published_at:  # the first generation it has not applied
            published_at[behind] = session.scalar(
                select(CatalogGeneration.created_at).where(CatalogGeneration.id > behind)
                .order_by(CatalogGeneration.id).limit(1))
        first = published_at[behind]
        lag.add_metric([agent.name], 0 if first is None else _seconds(now, first))
    by_state = GaugeMetricFamily("adapterplane_agents", "Registered agents by state: live, "
                                 "draining, drained, stale (not heard from within 60 s).",
                                 labels=["state"])
    for state, n in states.items():
        by_state.add_metric([state], n)
    counter = GaugeMetricFamily("adapterplane_catalog_version", "The catalog's change "
                                "counter (the newest generation row's id): what an agent "
                                "that is current reports as `adapter_publication_generation`.")
    counter.add_metric([], version)
    yield by_state
    yield heartbeat
    yield lag
    yield counter


def _seconds(now: datetime, then: datetime) -> float:
    return max(0.0, (now - then).total_seconds())
