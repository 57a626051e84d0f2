"""Agent registration, heartbeats and desired state.

* `register`: one row per agent name; every call (a process start) bumps
  `worker_epoch`, so reports of a previous process are refused (409 STALE_EPOCH).
  The name is bound to the token that first registered it: another token's
  registration is 409 AGENT_NAME_BOUND unless the bound token was revoked (rotation:
  issue a new token, revoke the old one, restart the agent) or an admin on `*` unbound
  the name (`unbind`, audited). Heartbeats and desired state need the bound token.
* `heartbeat`: replaces the agent's slot and load-failure report.
* `desired_state`: every alias of the agent's base with its recent generations and the
  files to fetch (file:// or presigned URLs), plus `prefetch` from placement
  (controlplane/placement). `version` is the catalog change counter: long-polls
  return as soon as it passes the caller's `after`. Incremental with `since=V` (the
  version the caller's replica is complete at): only aliases with a generation newer
  than `V` are sent (`full: false`), plus the complete `prefetch` digest list, so a
  poll costs O(changes) on the wire and in presigned URLs; a caller refreshes with a
  full state within `url_ttl_s` so its download URLs never expire. Full or not, it
  carries every namespace's scheduling policy (`tenants`, complete at
  `tenants_version`, the counter a weight/priority change bumps, and an alias hot-mark
  change too: a hot alias's artifact goes into `prefetch` on every compatible agent,
  so that change must wake waiting agents like a policy change).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.agents.repository import AgentRepository
from controlplane.audit.service import record_audit
from controlplane.auth.scopes import Principal, Role
from controlplane.contracts import (
    DesiredAlias,
    DesiredArtifact,
    DesiredCollection,
    DesiredFile,
    DesiredGeneration,
    DesiredState,
    HeartbeatRequest,
    RegisterRequest,
    TenantPolicy,
)
from controlplane.db import begin_write
from controlplane.errors import AdapterplaneError, Forbidden, NotFound
from controlplane.models import (
    Alias,
    ApiToken,
    Artifact,
    BaseModel,
    CatalogGeneration,
    CollectionMember,
    Namespace,
    utcnow,
)
from controlplane.models.agent import Agent
from controlplane.namespaces.service import tenants_version
from controlplane.placement.policy import AdapterDemand, capacity_from_record, place
from controlplane.storage import ObjectStore
from controlplane.storage.urls import URL_TTL_S, object_url

HISTORY_LIMIT = 8
"""Generations per alias sent to agents (enough to pin a recent one)."""
LIVE_WINDOW = timedelta(seconds=60)
"""Agents seen within this window take part in placement."""


class StaleEpoch(AdapterplaneError):
    status_code = 409
    code = "STALE_EPOCH"


class AgentNameBound(AdapterplaneError):
    status_code = 409
    code = "AGENT_NAME_BOUND"


def register(session: Session, body: RegisterRequest, principal: Principal) -> Agent:
    """Create or re-register `body.name` with a fresh worker epoch. Commits."""
    begin_write(session)
    repo = AgentRepository(session)
    caps = body.capabilities.model_dump()
    agent = repo.by_name(body.name)
    now = utcnow()
    if agent is None:
        agent = repo.add(Agent(name=body.name, url=body.url, h_base=body.capabilities.base,
                               capabilities=caps, worker_epoch=1, registered_at=now, slots=[],
                               load_failures=[], catalog_version=0,
                               registered_by=principal.actor, token_id=principal.token_id))
    else:
        if not _bound_to(session, agent, principal):
            raise AgentNameBound(
                f"agent name {body.name!r} is bound to another token; an admin can "
                "unbind it (adapterctl agents unbind)",
                detail={"name": body.name, "state": agent_state(agent)})
        agent.worker_epoch += 1
        agent.url, agent.h_base, agent.capabilities = body.url, body.capabilities.base, caps
        agent.registered_at, agent.slots, agent.load_failures = now, [], []
        agent.last_heartbeat_at, agent.catalog_version = None, 0
        agent.registered_by, agent.token_id = principal.actor, principal.token_id
    record_audit(session, actor=principal.actor, action="agent.register", namespace=None,
                 target=f"agent:{body.name}",
                 detail={"worker_epoch": agent.worker_epoch, "base": body.capabilities.base})
    session.commit()
    return agent


def _bound_to(session: Session, agent: Agent, principal: Principal) -> bool:
    """Whether `principal` may act as `agent`: its bound token, or any token when the
    name is unbound or its token was revoked."""
    if agent.token_id is None or agent.token_id == principal.token_id:
        return True
    bound = session.get(ApiToken, agent.token_id)
    return bound is None or bound.revoked


def unbind(session: Session, agent_id: int, actor: str) -> Agent:
    """Release the agent's name from its token: the next registration binds it. Commits."""
    begin_write(session)
    agent = get_agent(session, agent_id)
    record_audit(session, actor=actor, action="agent.unbind", namespace=None,
                 target=f"agent:{agent.name}", detail={"token_id": agent.token_id})
    agent.token_id = None
    session.commit()
    return agent


def require_bound(session: Session, agent: Agent, principal: Principal) -> None:
    """403 unless `principal` is the agent's bound token (or an admin on `*`)."""
    if principal.can_global(Role.ADMIN) or agent.token_id in (None, principal.token_id):
        return
    raise Forbidden(f"this token is not agent {agent.name!r}'s credential",
                    detail={"agent": agent.name, "required": "the agent's token"})


def get_agent(session: Session, agent_id: int) -> Agent:
    agent = AgentRepository(session).get_by_id(agent_id)
    if agent is None:
        raise NotFound(f"agent {agent_id} not found", detail={"agent_id": agent_id})
    return agent


def check_epoch(agent: Agent, worker_epoch: int) -> None:
    if worker_epoch != agent.worker_epoch:
        raise StaleEpoch("a newer process of this agent has registered",
                         detail={"worker_epoch": worker_epoch,
                                 "current_epoch": agent.worker_epoch})


def heartbeat(session: Session, agent_id: int, body: HeartbeatRequest,
              principal: Principal) -> Agent:
    begin_write(session)
    agent = get_agent(session, agent_id)
    require_bound(session, agent, principal)
    check_epoch(agent, body.worker_epoch)
    agent.last_heartbeat_at = utcnow()
    agent.catalog_version = body.catalog_version
    agent.slots = [s.model_dump() for s in body.slots]
    agent.load_failures = [f.model_dump() for f in body.load_failures]
    session.commit()
    return agent


def _files(store: ObjectStore, files: Mapping[str, Any]) -> dict[str, DesiredFile]:
    return {name: DesiredFile(sha256=f["sha256"], size=f["size"],
                              url=object_url(store, str(f["key"])))
            for name, f in files.items()}


def _artifact_doc(store: ObjectStore, a: Artifact,
                  links: Mapping[int, CollectionMember]) -> DesiredArtifact:
    link = links.get(a.id)
    collection = None
    if link is not None and link.collection.files:
        collection = DesiredCollection(id=link.collection_id, digest=link.collection.digest,
                                       member=link.member_index,
                                       files=_files(store, link.collection.files))
    return DesiredArtifact(id=a.id, digest=a.digest, files=_files(store, a.files),
                           validated_record=a.validated_record, collection=collection)


def _collection_links(session: Session, artifact_ids: set[int]) -> dict[int, CollectionMember]:
    """Artifact id -> the (first) collection member it materialises."""
    if not artifact_ids:
        return {}
    rows = session.scalars(select(CollectionMember).where(
        CollectionMember.artifact_id.in_(sorted(artifact_ids)))
        .order_by(CollectionMember.id)).all()
    links: dict[int, CollectionMember] = {}
    for row in rows:
        links.setdefault(row.artifact_id, row)
    return links


def _demand(a: Artifact, h_base: str, hot: bool) -> AdapterDemand | None:
    record = a.validated_record or {}
    modules = record.get("modules") or []
    if a.digest is None or not modules:
        return None
    return AdapterDemand(digest=a.digest, h_base=h_base,
                         rank=max(int(m.get("rank", 0)) for m in modules),
                         roles=frozenset(str(m.get("role")) for m in modules),
                         nbytes=int(a.tensor_bytes or record.get("total_bytes") or 0),
                         hot=hot)


def desired_state(session: Session, store: ObjectStore, agent: Agent,
                  since: int | None = None) -> DesiredState:
    """The agent's desired state, all aliases or (``since``) those changed after it."""
    repo = AgentRepository(session)
    version = repo.catalog_version()
    demands: list[AdapterDemand] = []
    current_digest: dict[int, str | None] = {}
    to_send: list[tuple[Alias, list[CatalogGeneration]]] = []
    for alias in repo.aliases_for_base(agent.h_base):
        gens = repo.recent_generations(alias.id, HISTORY_LIMIT)
        if since is None or max((g.id for g in gens), default=0) > since:
            to_send.append((alias, list(gens)))
        current = next((g for g in gens if g.generation == alias.current_generation), None)
        art = current.artifact if current is not None else None
        current_digest[alias.id] = art.digest if art is not None else None
        demand = _demand(art, agent.h_base, alias.hot) if art is not None else None
        if demand is not None:
            demands.append(demand)
    links = _collection_links(session, {g.artifact.id for _, gens in to_send for g in gens
                                        if g.artifact is not None})
    placed = place(demands, _live_capacities(repo, agent)).get(agent.id, frozenset())
    items = [DesiredAlias(namespace=alias.namespace.name, alias=alias.name,
                          current_generation=alias.current_generation,
                          generations=[_generation_doc(store, g, links) for g in gens],
                          prefetch=current_digest[alias.id] in placed, hot=alias.hot)
             for alias, gens in to_send]
    prefetch = sorted({d for d in current_digest.values() if d is not None and d in placed})
    # the counter before the list: a change committed in between is then sent with an
    # older counter (the next poll returns at once), never missed
    policy_version = tenants_version(session)
    tenants = tenant_policies(session)
    return DesiredState(version=version, agent_id=agent.id, worker_epoch=agent.worker_epoch,
                        full=since is None, since=since, url_ttl_s=URL_TTL_S,
                        prefetch=prefetch, tenants_version=policy_version, tenants=tenants,
                        aliases=items)


def pinned_generation(session: Session, store: ObjectStore, agent: Agent, namespace: str,
                      alias: str, generation: int) -> DesiredAlias:
    """One generation of an alias of the agent's base, whatever its age: what an agent
    fetches to serve a pin (`ns/alias@N`) older than the `HISTORY_LIMIT` generations its
    desired state carries, or newer than its replica. 404 when the alias or generation
    does not exist (for this base)."""
    row = session.scalars(
        select(CatalogGeneration).join(Alias, Alias.id == CatalogGeneration.alias_id)
        .join(Namespace, Namespace.id == Alias.namespace_id)
        .join(BaseModel, BaseModel.id == Alias.base_id)
        .where(Namespace.name == namespace, Alias.name == alias,
               BaseModel.h_base == agent.h_base, CatalogGeneration.generation == generation)
    ).unique().one_or_none()
    if row is None:
        raise NotFound(f"{namespace}/{alias} has no generation {generation}",
                       detail={"kind": "generation", "ref": f"{namespace}/{alias}@{generation}"})
    links = _collection_links(session, {row.artifact.id} if row.artifact is not None else set())
    return DesiredAlias(namespace=namespace, alias=alias,
                        current_generation=row.alias.current_generation,
                        generations=[_generation_doc(store, row, links)], prefetch=False,
                        hot=row.alias.hot)


def tenant_policies(session: Session) -> list[TenantPolicy]:
    """Every namespace's scheduling policy, by name."""
    rows = session.execute(select(Namespace.name, Namespace.weight, Namespace.priority)
                           .order_by(Namespace.name)).all()
    return [TenantPolicy.model_validate({"namespace": name, "weight": weight,
                                         "priority": priority})
            for name, weight, priority in rows]


def _generation_doc(store: ObjectStore, g: CatalogGeneration,
                    links: Mapping[int, CollectionMember]) -> DesiredGeneration:
    return DesiredGeneration(
        generation=g.generation, action=g.action,
        artifact=_artifact_doc(store, g.artifact, links) if g.artifact is not None else None)


def agent_state(agent: Agent) -> str:
    """`live` when heard from within :data:`LIVE_WINDOW` (what placement counts), else
    `stale`."""
    seen = agent.last_heartbeat_at or agent.registered_at
    return "live" if seen >= utcnow() - LIVE_WINDOW else "stale"


def _live_capacities(repo: AgentRepository, me: Agent) -> list[Any]:
    cutoff = utcnow() - LIVE_WINDOW
    caps = []
    for a in repo.for_base(me.h_base):
        seen = a.last_heartbeat_at or a.registered_at
        if a.id != me.id and seen < cutoff:
            continue
        holds = [str(s.get("artifact_digest")) for s in a.slots
                 if s.get("state") in ("active", "idle")]
        caps.append(capacity_from_record(a.id, a.h_base, a.capabilities, holds))
    return caps
