"""/v1/agents: register, heartbeat, desired state (long-poll), list; token authorization.

Agents authenticate with an agent token (`is_agent`) or an admin token on `*`.
`GET /v1/agents/{id}/desired-state?after=V&wait=S` returns at once when the catalog
version is past `V`, else holds the request up to `S` seconds (<= 30), checking the
catalog again whenever Postgres NOTIFYs a catalog change (controlplane/agents/notify.py;
every 100 ms on SQLite), and answers with the then-current state either way, so an agent
learns of a publish within a fraction of a second without polling slowly itself.
`&since=V` makes the answer incremental (only aliases changed after catalog version V,
`full: false`; see `controlplane.agents.service.desired_state`). `&tenants_after=T`
also returns as soon as the tenant-policy counter (`tenants_version`) is past `T`: a
namespace weight/priority change or an alias hot-mark change (which moves `prefetch`)
NOTIFYs the same channel, so it reaches a waiting agent as promptly as a publish (without
it, only the catalog version is waited on).

An agent name is bound to the token that registered it (`register` in service.py):
register, heartbeat and desired state under another agent's name are refused.

`POST /v1/agents/{id}/drain` and `/undrain` (admin on `*`, or the agent's own bound
token, so a Kubernetes preStop hook holding the agent's credential can drain it) set the
drain flag routers obey; the agent hears it in its next heartbeat answer, turns its
`/readyz` 503 and reports `drained` once nothing is in flight. `GET /v1/agents?name=N`
lists the one agent of that name (or none), how the CLI resolves a name (and how an
agent finds, before it loads a model, the merged release it is assigned).

`POST /v1/agents/{id}/release` (admin on `*`) assigns the agent a merged release to
serve as its base, `DELETE` clears it (controlplane/agents/release.py); the heartbeat
answer's `release_base` tells the agent.

`GET /v1/agents/authorize?namespace=NS` is called by agents *with a client's token*:
200 when that token may read NS, 401/403 otherwise.

Bodies and answers are the wire models the agent shares (controlplane/contracts.py).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session, sessionmaker

from controlplane.agents.notify import catalog_waiter
from controlplane.agents.release import agent_release, assign_release, clear_release, release_base
from controlplane.agents.repository import AgentRepository
from controlplane.agents.service import (
    agent_state,
    check_epoch,
    desired_state,
    get_agent,
    heartbeat,
    pinned_generation,
    register,
    require_bound,
    set_drain,
    unbind,
)
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Principal, Role
from controlplane.contracts import (
    AgentLoad,
    AgentOut,
    AuthorizeOut,
    DesiredAlias,
    DesiredState,
    HeartbeatOut,
    HeartbeatRequest,
    RegisterRequest,
)
from controlplane.errors import Forbidden
from controlplane.kit.deps import SessionDep, StoreDep
from controlplane.models.agent import Agent
from controlplane.namespaces.service import tenants_version

router = APIRouter(prefix="/v1/agents", tags=["agents"])
AgentId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _require_agent(principal: Principal) -> None:
    if not (principal.is_agent or principal.can_global(Role.ADMIN)):
        raise Forbidden("an agent token (or admin on '*') is required",
                        detail={"required": "agent"})


def agent_out(a: Agent) -> AgentOut:
    return AgentOut.model_validate({
        "id": a.id, "name": a.name, "url": a.url, "base": a.h_base,
        "capabilities": a.capabilities, "worker_epoch": a.worker_epoch,
        "registered_at": a.registered_at, "last_heartbeat_at": a.last_heartbeat_at,
        "catalog_version": a.catalog_version, "slots": a.slots,
        "load_failures": a.load_failures, "load": AgentLoad.model_validate(a.load or {}),
        "drain": a.drain, "drained": a.drained, "state": agent_state(a),
        "release": agent_release(a)})


class AssignRelease(BaseModel):
    """Body of `POST /v1/agents/{id}/release`."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(max_length=63, description="The merge's namespace.")
    release: str = Field(max_length=80, description="Merge id or `sha256:<H_merged>`.")


@router.post("/register", status_code=status.HTTP_201_CREATED, response_model=AgentOut)
def register_agent(body: RegisterRequest, principal: CurrentPrincipal,
                   session: SessionDep) -> AgentOut:
    """Register (or re-register) an agent; the answer carries its new worker epoch."""
    _require_agent(principal)
    return agent_out(register(session, body, principal))


@router.get("/authorize", response_model=AuthorizeOut)
def authorize(namespace: Annotated[str, Query(max_length=63)],
              principal: CurrentPrincipal) -> AuthorizeOut:
    """Whether the caller's token may read `namespace` (403 if not)."""
    principal.require(namespace, Role.READ)
    role = principal.role_in(namespace)
    return AuthorizeOut(namespace=namespace, role=role.value if role else "read",
                        actor=principal.actor)


@router.get("", response_model=list[AgentOut])
def list_agents(principal: CurrentPrincipal, session: SessionDep,
                name: Annotated[str | None, Query(max_length=200, description=(
                    "Only the agent of this exact name (an empty list when none)."))] = None,
                ) -> list[AgentOut]:
    """Every registered agent (global read; agent tokens have it), or with `name` the
    one of that name."""
    principal.require_global(Role.READ)
    repo = AgentRepository(session)
    query = repo.select().order_by(Agent.id)
    if name is not None:
        query = query.where(Agent.name == name)
    return [agent_out(a) for a in repo.session.scalars(query)]


@router.get("/{agent_id}", response_model=AgentOut)
def show_agent(agent_id: AgentId, principal: CurrentPrincipal, session: SessionDep) -> AgentOut:
    principal.require_global(Role.READ)
    return agent_out(get_agent(session, agent_id))


@router.post("/{agent_id}/unbind", response_model=AgentOut)
def unbind_agent(agent_id: AgentId, principal: CurrentPrincipal,
                 session: SessionDep) -> AgentOut:
    """Release the agent's name from the token bound to it (admin on `*`, audited): the
    next token that registers the name owns it."""
    principal.require_global(Role.ADMIN)
    return agent_out(unbind(session, agent_id, principal.actor))


@router.post("/{agent_id}/drain", response_model=AgentOut)
def drain_agent(agent_id: AgentId, principal: CurrentPrincipal,
                session: SessionDep) -> AgentOut:
    """Ask the agent to drain (admin on `*` or the agent's own token; audited,
    idempotent): routers send it no new requests, placement moves its adapters
    elsewhere, and the agent reports `drained` once its in-flight requests finished."""
    return agent_out(set_drain(session, agent_id, True, principal))


@router.post("/{agent_id}/undrain", response_model=AgentOut)
def undrain_agent(agent_id: AgentId, principal: CurrentPrincipal,
                  session: SessionDep) -> AgentOut:
    """Lift a drain (admin on `*` or the agent's own token; audited, idempotent): the
    agent takes new requests again; `drained` is cleared."""
    return agent_out(set_drain(session, agent_id, False, principal))


@router.post("/{agent_id}/heartbeat", response_model=HeartbeatOut)
def post_heartbeat(agent_id: AgentId, body: HeartbeatRequest, principal: CurrentPrincipal,
                   session: SessionDep) -> HeartbeatOut:
    """Slot, load-failure and load report; 409 STALE_EPOCH from a superseded process.
    The answer's `drain` says whether the agent should drain."""
    _require_agent(principal)
    agent = heartbeat(session, agent_id, body, principal)
    version = AgentRepository(session).catalog_version()
    return HeartbeatOut(worker_epoch=agent.worker_epoch, catalog_version=version,
                        drain=agent.drain, release_base=release_base(agent))


@router.post("/{agent_id}/release", response_model=AgentOut)
def assign_agent_release(agent_id: AgentId, body: AssignRelease, principal: CurrentPrincipal,
                         session: SessionDep, store: StoreDep) -> AgentOut:
    """Assign the agent a merged release to serve as its base (admin on `*`, audited,
    idempotent): it drains, restarts and loads the release's checkpoint. The merge must
    be `merged`, intact, and made from the agent's model."""
    principal.require_global(Role.ADMIN)
    return agent_out(assign_release(session, store, agent_id, body.namespace, body.release,
                                    principal.actor))


@router.delete("/{agent_id}/release", response_model=AgentOut)
def clear_agent_release(agent_id: AgentId, principal: CurrentPrincipal,
                        session: SessionDep) -> AgentOut:
    """Clear the agent's release assignment (admin on `*`, audited, idempotent): it
    returns to the base it is configured with."""
    principal.require_global(Role.ADMIN)
    return agent_out(clear_release(session, agent_id, principal.actor))


@router.get("/{agent_id}/generation", response_model=DesiredAlias)
def get_pinned_generation(
    request: Request, agent_id: AgentId, principal: CurrentPrincipal, session: SessionDep,
    worker_epoch: Annotated[int, Query(ge=1, le=2**31 - 1)],
    namespace: Annotated[str, Query(max_length=63)],
    alias: Annotated[str, Query(max_length=200)],
    generation: Annotated[int, Query(ge=1, le=2**31 - 1)],
) -> DesiredAlias:
    """One generation of an alias, at any age (its artifact's files as in desired state):
    how an agent serves a pin to a generation its desired state does not carry."""
    _require_agent(principal)
    agent = get_agent(session, agent_id)
    require_bound(session, agent, principal)
    check_epoch(agent, worker_epoch)
    return pinned_generation(session, request.app.state.store, agent, namespace, alias,
                             generation)


@router.get("/{agent_id}/desired-state", response_model=DesiredState)
async def get_desired_state(
    request: Request, agent_id: AgentId, principal: CurrentPrincipal,
    worker_epoch: Annotated[int, Query(ge=1, le=2**31 - 1)],
    after: Annotated[int, Query(ge=-1, le=2**63 - 1)] = -1,
    wait: Annotated[float, Query(ge=0, le=30)] = 0,
    since: Annotated[int, Query(ge=-1, le=2**63 - 1)] = -1,
    tenants_after: Annotated[int | None, Query(ge=-1, le=2**63 - 1)] = None,
) -> DesiredState:
    """Long-poll for the agent's desired state (see module docstring)."""
    _require_agent(principal)
    factory: sessionmaker[Session] = request.app.state.session_factory
    store = request.app.state.store

    def changed() -> bool:
        with factory() as session:
            agent = get_agent(session, agent_id)
            require_bound(session, agent, principal)
            check_epoch(agent, worker_epoch)
            if AgentRepository(session).catalog_version() > after:
                return True
            return tenants_after is not None and tenants_version(session) > tenants_after

    waiter = catalog_waiter(request.app)
    deadline = time.monotonic() + wait
    while not await run_in_threadpool(changed):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or await request.is_disconnected():
            break
        await waiter.wait(remaining)

    def build() -> DesiredState:
        with factory() as session:
            return desired_state(session, store, get_agent(session, agent_id),
                                 since if since >= 0 else None)

    return await run_in_threadpool(build)
