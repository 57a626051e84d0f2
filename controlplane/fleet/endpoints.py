"""/v1/fleet/routing: the routing state routers replicate (long-poll on the catalog).

`GET /v1/fleet/routing?since=V&wait=S` answers at once when the catalog counter is past
`V` (with every alias), else holds up to `S` seconds (<= 30) for a catalog change and
then answers with `aliases: null` (the caller's replica is current). Agents are in every
answer, so a router polling with a short `wait` keeps both its alias replica (changes
within a NOTIFY) and its agent table (at most `wait` old) fresh with one request.

Routers authenticate with a token that reads every namespace (read on `*`) or an agent
token: the answer names every alias and every agent.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from controlplane.agents.notify import catalog_waiter
from controlplane.agents.repository import AgentRepository
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.contracts import RoutingState
from controlplane.errors import Forbidden
from controlplane.fleet.service import routing_state

router = APIRouter(prefix="/v1/fleet", tags=["fleet"])


@router.get("/routing", response_model=RoutingState)
async def get_routing_state(
    request: Request, principal: CurrentPrincipal,
    since: Annotated[int, Query(ge=-1, le=2**63 - 1)] = -1,
    wait: Annotated[float, Query(ge=0, le=30)] = 0,
) -> RoutingState:
    """Aliases (when the catalog moved past `since`) and agents (always); see module
    docstring."""
    if not (principal.is_agent or principal.can_global(Role.READ)):
        raise Forbidden("the routing state needs read on every namespace ('*') or an agent "
                        "token", detail={"required": "read on '*'"})
    factory: sessionmaker[Session] = request.app.state.session_factory

    def version() -> int:
        with factory() as session:
            return AgentRepository(session).catalog_version()

    waiter = catalog_waiter(request.app)
    deadline = time.monotonic() + wait
    while since >= 0 and await run_in_threadpool(version) == since:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or await request.is_disconnected():
            break
        await waiter.wait(remaining)

    def build() -> RoutingState:
        with factory() as session:
            return routing_state(session, since if since >= 0 else None)

    return await run_in_threadpool(build)
