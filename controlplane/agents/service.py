"""Agent registration, heartbeats and desired state.

* `register`: one row per agent name; every call (a process start) bumps
  `worker_epoch`, so reports of a previous process are refused (409 STALE_EPOCH).
  The name is bound to the token that first registered it: another token's
  registration is 409 AGENT_NAME_BOUND unless the bound token was revoked (rotation:
  issue a new token, revoke the old one, restart the agent) or an admin on `*` unbound
  the name (`unbind`, audited). Heartbeats and desired state need the bound token.
  A registration is a new process: it clears `drain` and `drained` (a restarted agent
  joins serving again; drain it again if it should not).
* `heartbeat`: replaces the agent's slot, load-failure and load report (and `drained`,
  kept only while `drain` is set); the answer's `drain` tells the agent to drain.
* `set_drain`: an operator's (or the agent's own preStop hook's) drain / undrain,
  audited and idempotent. Routers send a draining agent no new requests; placement
  stops counting it for the *other* agents (its adapters are placed elsewhere) and
  gives it nothing new itself (its prefetch keeps only what it holds).
* `desired_state`: every alias of the agent's base (and every alias with a generation
  serving a merged release whose checkpoint is that base) with its recent generations
  and the files to fetch (file:// or presigned URLs), plus `prefetch` from placement
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
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.agents.repository import AgentRepository
from controlplane.audit.service import record_audit
from controlplane.auth.scopes import Principal, Role
from controlplane.contracts import (
    AgentLoad,
    DesiredAlias,
    DesiredArtifact,
    DesiredCollection,
    DesiredFile,
    DesiredGeneration,
    DesiredRelease,
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
    CatalogGeneration,
    CollectionMember,
    Namespace,
    utcnow,
)
from controlplane.models.agent import Agent
from controlplane.namespaces.service import tenants_version
from controlplane.placement.policy import (
    AdapterDemand,
    capacity_from_record,
    place,
    replica_targets,
)
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
    """Create or re-register `body.name` with a fresh worker epoch. Commits.

    A registration is a new process of the agent: its last load report is dropped and
    `drain`/`drained` are cleared, so a restarted agent joins serving."""
    begin_write(session)
    repo = AgentRepository(session)
    caps = body.capabilities.model_dump()
    agent = repo.by_name(body.name)
    now = utcnow()
    if agent is None:
        agent = repo.add(Agent(name=body.name, url=body.url, h_base=body.capabilities.base,
                               capabilities=caps, worker_epoch=1, registered_at=now, slots=[],
                               load_failures=[], catalog_version=0, load={}, drain=False,
                               drained=False, registered_by=principal.actor,
                               token_id=principal.token_id))
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
        agent.load, agent.drain, agent.drained = {}, False, False
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
    agent.load = AgentLoad(live_requests=body.live_requests,
                           waiting_requests=body.waiting_requests, free_pages=body.free_pages,
                           pool_pages=body.pool_pages).model_dump()
    # a report of a drain the operator has since lifted means nothing
    agent.drained = body.drained and agent.drain
    session.commit()
    return agent


def set_drain(session: Session, agent_id: int, drain: bool, principal: Principal) -> Agent:
    """Drain (`drain=True`) or undrain an agent: admin on `*` or the agent's own bound
    token. Idempotent (draining a draining agent changes nothing, but is audited like
    any other call); undrain also clears `drained`. Commits."""
    begin_write(session)
    agent = get_agent(session, agent_id)
    _require_admin_or_own(agent, principal)
    was = agent.drain
    agent.drain = drain
    if not (drain and was):  # undrained, or a new drain the agent has yet to report on
        agent.drained = False
    record_audit(session, actor=principal.actor,
                 action="agent.drain" if drain else "agent.undrain", namespace=None,
                 target=f"agent:{agent.name}", detail={"was_draining": was})
    session.commit()
    return agent


def _require_admin_or_own(agent: Agent, principal: Principal) -> None:
    """403 unless `principal` is an admin on `*` or the agent token bound to `agent`
    (not merely any agent token while the name is unbound)."""
    if principal.can_global(Role.ADMIN) or agent.token_id == principal.token_id:
        return
    raise Forbidden(f"draining agent {agent.name!r} needs admin on '*' or its own token",
                    detail={"agent": agent.name, "required": "admin on '*' or the agent's "
                            "token"})


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
        if alias.base.h_base != agent.h_base:
            art = None  # a release agent serves no adapter
        current_digest[alias.id] = art.digest if art is not None else None
        demand = _demand(art, agent.h_base, alias.hot) if art is not None else None
        if demand is not None:
            demands.append(demand)
    links = _collection_links(session, {g.artifact.id for _, gens in to_send for g in gens
                                        if g.artifact is not None})
    placed = place(with_replicas(demands, _live_agents(repo, agent)),
                   _live_capacities(repo, agent)).get(agent.id, frozenset())
    if agent.drain:  # leaving: keep what it holds, prefetch nothing new
        placed = placed & holds(agent)
    items = [DesiredAlias(namespace=alias.namespace.name, alias=alias.name,
                          base=alias.base.h_base, current_generation=alias.current_generation,
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
        .where(Namespace.name == namespace, Alias.name == alias,
               Alias.id.in_([a.id for a in AgentRepository(session).aliases_for_base(
                   agent.h_base)]),
               CatalogGeneration.generation == generation)
    ).unique().one_or_none()
    if row is None:
        raise NotFound(f"{namespace}/{alias} has no generation {generation}",
                       detail={"kind": "generation", "ref": f"{namespace}/{alias}@{generation}"})
    links = _collection_links(session, {row.artifact.id} if row.artifact is not None else set())
    return DesiredAlias(namespace=namespace, alias=alias, base=row.alias.base.h_base,
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
    release = None
    if g.merge is not None and g.merge.digest is not None and g.merge.merged_base is not None:
        release = DesiredRelease(id=g.merge.id, digest=g.merge.digest,
                                 base=g.merge.merged_base.h_base)
    return DesiredGeneration(
        generation=g.generation, action=g.action,
        artifact=_artifact_doc(store, g.artifact, links) if g.artifact is not None else None,
        release=release)


def agent_state(agent: Agent) -> str:
    """`stale` when not heard from within :data:`LIVE_WINDOW` (placement does not count
    it); otherwise `drained` (asked to drain, and its last heartbeat said nothing is left
    in flight), `draining` (asked to drain) or `live`."""
    seen = agent.last_heartbeat_at or agent.registered_at
    if seen < utcnow() - LIVE_WINDOW:
        return "stale"
    if agent.drain:
        return "drained" if agent.drained else "draining"
    return "live"


def _live_agents(repo: AgentRepository, me: Agent) -> list[Agent]:
    """The agents placement counts for `me`'s desired state: `me`, and every other agent
    of its base heard from within :data:`LIVE_WINDOW` that is not draining (a draining
    agent is leaving: its adapters are placed elsewhere). `desired_state` narrows a
    draining `me`'s own placement to what it holds."""
    cutoff = utcnow() - LIVE_WINDOW
    return [a for a in repo.for_base(me.h_base)
            if a.id == me.id or ((a.last_heartbeat_at or a.registered_at) >= cutoff
                                 and not a.drain)]


def _live_capacities(repo: AgentRepository, me: Agent) -> list[Any]:
    return [capacity_from_record(a.id, a.h_base, a.capabilities, sorted(holds(a)))
            for a in _live_agents(repo, me)]


def with_replicas(demands: list[AdapterDemand], agents: list[Agent]) -> list[AdapterDemand]:
    """`demands` with the copies each wants from the request rates `agents` reported
    (the sum over their slot reports' `rate`; placement/policy.py `replica_targets`)."""
    rates: dict[str, float] = {}
    for a in agents:
        for slot in a.slots:
            rate = slot.get("rate") or 0.0
            if rate > 0:
                digest = str(slot.get("artifact_digest"))
                rates[digest] = rates.get(digest, 0.0) + float(rate)
    targets = replica_targets(rates, len(agents))
    return [replace(d, replicas=targets.get(d.digest)) for d in demands]


def holds(agent: Agent) -> frozenset[str]:
    """Digests the agent's last heartbeat reported resident (active or idle) or loading: a
    load under way is the agent's to keep, so placement does not move it elsewhere (and
    start a second load) while it runs."""
    return frozenset(str(s.get("artifact_digest")) for s in agent.slots
                     if s.get("state") in ("loading", "active", "idle"))
