"""Agents: the fleet table, one agent's residency and load failures, and the live
numbers fragments that htmx polls (`/live`), scraped server-side from each agent."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from controlplane.console.rendering import render
from controlplane.console.route import ConsoleRoute
from controlplane.console.session import CONSOLE_PREFIX, ConsolePrincipal
from controlplane.console.views.agents import (
    ScrapeHistory,
    agent_detail,
    agent_list,
    scrape_live,
)
from controlplane.kit.deps import SessionDep

router = APIRouter(prefix=CONSOLE_PREFIX, route_class=ConsoleRoute, include_in_schema=False)
AgentId = Annotated[int, Path(ge=1, le=2**63 - 1)]
POLL_S = 5
"""How often the live numbers refresh (htmx `every`)."""


def _history(request: Request) -> ScrapeHistory:
    history: ScrapeHistory = request.app.state.console_scrapes
    return history


@router.get("/agents")
def agents_page(request: Request, principal: ConsolePrincipal,
                session: SessionDep) -> Response:
    return render(request, "agents.html", {"agents": agent_list(session, principal),
                                           "poll_s": POLL_S})


@router.get("/agents/live")
async def agents_live(request: Request, principal: ConsolePrincipal,
                      session: SessionDep) -> Response:
    agents = await run_in_threadpool(agent_list, session, principal)
    rows = await scrape_live(agents, _history(request))
    return render(request, "agents_live.html", {"rows": rows})


@router.get("/agents/{agent_id}")
def agent_page(request: Request, agent_id: AgentId, principal: ConsolePrincipal,
               session: SessionDep) -> Response:
    return render(request, "agent.html", {"agent": agent_detail(session, principal, agent_id),
                                          "poll_s": POLL_S})


@router.get("/agents/{agent_id}/live")
async def agent_live(request: Request, agent_id: AgentId, principal: ConsolePrincipal,
                     session: SessionDep) -> Response:
    agent = await run_in_threadpool(agent_detail, session, principal, agent_id)
    rows = await scrape_live([agent], _history(request))
    return render(request, "agents_live.html", {"rows": rows})
