"""The router's replica of the control plane's routing state.

:meth:`RoutingTable.run` long-polls `GET /v1/fleet/routing?since=V&wait=refresh_s`: the
answer comes at once when the catalog changes (with every alias) and after `refresh_s`
otherwise (agents only), so the alias replica lags a publish by one NOTIFY and the agent
table is at most `refresh_s` old. A failed poll keeps the last table (the fleet goes on
serving through a control-plane outage; an agent that stops answering is skipped by the
router's own down marks) and is retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from pydantic import ValidationError

from agent.router.routing import AgentView
from controlplane.contracts import RouteAgent, RouteAlias, RoutingState

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0


class RoutingTable:
    """Aliases by (namespace, alias), agents by id, and their routing views."""

    def __init__(self) -> None:
        self.version = -1
        self.lease_s = 10.0
        self.aliases: dict[tuple[str, str], RouteAlias] = {}
        self.agents: dict[int, RouteAgent] = {}
        self.views: list[AgentView] = []
        self.base_names: dict[str, str] = {}
        """served model name -> H_base, for requests naming a bare base model."""
        self.refreshed_at: float | None = None
        """Monotonic time of the last applied answer (None: none yet, not ready)."""

    @property
    def ready(self) -> bool:
        return self.refreshed_at is not None

    def apply(self, state: RoutingState) -> None:
        if state.aliases is not None:
            self.aliases = {(a.namespace, a.alias): a for a in state.aliases}
        self.version = state.version
        self.lease_s = state.lease_s
        self.agents = {a.id: a for a in state.agents}
        self.views = [_view(a) for a in state.agents]
        self.base_names = {a.served_model_name: a.base for a in state.agents
                           if a.served_model_name}
        self.refreshed_at = time.monotonic()

    async def refresh(self, http: httpx.AsyncClient, wait_s: float) -> None:
        response = await http.get("/v1/fleet/routing",
                                  params={"since": self.version, "wait": wait_s},
                                  timeout=wait_s + 10.0)
        response.raise_for_status()
        self.apply(RoutingState.model_validate_json(response.content))

    async def run(self, http: httpx.AsyncClient, refresh_s: float) -> None:
        """Keep the replica fresh until cancelled."""
        backoff = 0.1
        while True:
            try:
                await self.refresh(http, refresh_s)
                backoff = 0.1
            except (httpx.HTTPError, ValidationError) as exc:
                log.warning("routing state: %s (keeping the last table, retry in %.1fs)",
                            exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)


def _view(a: RouteAgent) -> AgentView:
    return AgentView(agent_id=a.id, base=a.base, max_rank=a.max_rank,
                     targets=frozenset(a.targets), resident=frozenset(a.resident),
                     arriving=frozenset(a.arriving),
                     reported_load=a.load.live_requests + a.load.waiting_requests,
                     heartbeat_age_s=a.heartbeat_age_s, drain=a.drain,
                     free_pages=a.load.free_pages)
