"""Agent pages: every registered agent with its health, residency and recent load
failures (what its heartbeats stored, through the API's `agent_out`), and its live
numbers scraped from its `/metrics` (live_metrics.py).

Scrapes run concurrently, server-side, each with a short timeout, only for agents heard
from within the liveness window; the previous sample of each agent process (id and
worker epoch) is kept in the app so a request rate can be computed between two polls.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import httpx
from sqlalchemy.orm import Session

from controlplane.agents.endpoints import agent_out
from controlplane.agents.repository import AgentRepository
from controlplane.agents.service import get_agent
from controlplane.auth.scopes import Principal, Role
from controlplane.console.views.live_metrics import (
    LiveNumbers,
    MetricsSample,
    NotMetrics,
    live_numbers,
    parse_metrics,
)
from controlplane.contracts import AgentOut
from controlplane.models.agent import Agent

SCRAPE_TIMEOUT_S = 1.0
HISTORY_AGENTS = 1024
"""Agent processes whose previous sample is remembered (oldest forgotten first)."""


@dataclass(frozen=True)
class AgentLive:
    agent: AgentOut
    numbers: LiveNumbers | None
    """None: unavailable (stale agent, or the scrape failed)."""
    reason: str | None


class ScrapeHistory:
    """The last `MetricsSample` per agent process, bounded (one per app)."""

    def __init__(self, capacity: int = HISTORY_AGENTS) -> None:
        self.capacity = capacity
        self._samples: OrderedDict[tuple[int, int], MetricsSample] = OrderedDict()

    def swap(self, key: tuple[int, int], sample: MetricsSample) -> MetricsSample | None:
        """Store `sample`; return the one it replaces."""
        before = self._samples.pop(key, None)
        self._samples[key] = sample
        while len(self._samples) > self.capacity:
            self._samples.popitem(last=False)
        return before


def agent_list(session: Session, principal: Principal) -> list[AgentOut]:
    principal.require_global(Role.READ)
    repo = AgentRepository(session)
    return [agent_out(a) for a in session.scalars(repo.select().order_by(Agent.id))]


def agent_detail(session: Session, principal: Principal, agent_id: int) -> AgentOut:
    principal.require_global(Role.READ)
    return agent_out(get_agent(session, agent_id))


def metrics_url(agent: AgentOut) -> str:
    return agent.url.rstrip("/") + "/metrics"


async def _scrape(client: httpx.AsyncClient, agent: AgentOut,
                  history: ScrapeHistory) -> AgentLive:
    if agent.state == "stale":
        return AgentLive(agent, None, "stale: no heartbeat within the liveness window")
    try:
        response = await client.get(metrics_url(agent))
        response.raise_for_status()
        sample = parse_metrics(response.text, time.monotonic())
    except (httpx.HTTPError, NotMetrics) as exc:
        return AgentLive(agent, None, f"scrape failed ({type(exc).__name__})")
    before = history.swap((agent.id, agent.worker_epoch), sample)
    return AgentLive(agent, live_numbers(sample, before), None)


async def scrape_live(agents: list[AgentOut], history: ScrapeHistory,
                      timeout_s: float = SCRAPE_TIMEOUT_S) -> list[AgentLive]:
    """Every agent's live numbers, in `agents` order, within about `timeout_s` in all."""
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False,
                                 trust_env=False) as client:
        return list(await asyncio.gather(*(_scrape(client, a, history) for a in agents)))
