"""The routing state routers keep a replica of: every alias's current generation and
every agent's reach, capabilities, residency, placement, load and drain flag.

An agent's `resident` digests are what its last heartbeat reported in its pool;
`arriving` ones are loading there or assigned to it by placement now (the same
computation its desired state makes, so it prefetches them). Routers send a request to
where its adapter is, or is about to be, before hashing it onto another agent, which
keeps a newly published adapter to one load even when its first requests arrive before
any heartbeat mentions it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from controlplane.agents.repository import AgentRepository
from controlplane.agents.service import LIVE_WINDOW, holds, with_replicas
from controlplane.contracts import AgentLoad, DesiredRelease, RouteAgent, RouteAlias, RoutingState
from controlplane.models import (
    Alias,
    Artifact,
    BaseModel,
    CatalogGeneration,
    Merge,
    Namespace,
    utcnow,
)
from controlplane.models.agent import Agent
from controlplane.placement.policy import AdapterDemand, capacity_from_record, place

LEASE_S = 10.0
"""An agent not heard from for this long is out of the routing table (five heartbeats
at the agent's default interval of 2 s)."""
RESIDENT_STATES = ("active", "idle", "retiring", "cached")
"""Slot states whose adapter is in the agent's pool (`loading` ones are arriving)."""


def routing_state(session: Session, since: int | None) -> RoutingState:
    """The routing state; `aliases` is None when `since` is the current catalog version."""
    version = AgentRepository(session).catalog_version()
    current = route_aliases(session)
    agents = list(session.scalars(select(Agent).order_by(Agent.id)))
    assigned = _assignments(current, agents)
    now = utcnow()
    return RoutingState(version=version, lease_s=LEASE_S,
                        aliases=None if since == version else current,
                        agents=[_agent(a, now, assigned.get(a.id, frozenset()))
                                for a in agents])


def _assignments(aliases: list[RouteAlias], agents: list[Agent]) -> dict[int, frozenset[str]]:
    """Placement's `{agent id: digests}` over the live agents, base by base."""
    cutoff = utcnow() - LIVE_WINDOW
    out: dict[int, frozenset[str]] = {}
    for base in {a.base for a in aliases if a.digest is not None}:
        live = [a for a in agents if a.h_base == base
                and (a.last_heartbeat_at or a.registered_at) >= cutoff and not a.drain]
        if not live:
            continue
        demands = [AdapterDemand(digest=a.digest, h_base=base, rank=a.rank,
                                 roles=frozenset(a.roles), nbytes=a.nbytes, hot=a.hot)
                   for a in aliases if a.base == base and a.digest is not None]
        caps = [capacity_from_record(a.id, a.h_base, a.capabilities, sorted(holds(a)))
                for a in live]
        out.update(place(with_replicas(demands, live), caps))
    return out


def route_aliases(session: Session) -> list[RouteAlias]:
    """Every alias with a generation: its current one and that artifact's shape."""
    gen = aliased(CatalogGeneration)
    release_base = aliased(BaseModel)
    rows = session.execute(
        select(Namespace.name, Alias.name, Alias.current_generation, BaseModel.h_base,
               Alias.hot, Artifact.digest, Artifact.validated_record, Artifact.tensor_bytes,
               Merge.id, Merge.digest, release_base.h_base)
        .join(Namespace, Namespace.id == Alias.namespace_id)
        .join(BaseModel, BaseModel.id == Alias.base_id)
        .join(gen, (gen.alias_id == Alias.id) & (gen.generation == Alias.current_generation))
        .outerjoin(Artifact, Artifact.id == gen.artifact_id)
        .outerjoin(Merge, Merge.id == gen.merge_id)
        .outerjoin(release_base, release_base.id == Merge.merged_base_id)
        .where(Alias.current_generation > 0)
        .order_by(Namespace.name, Alias.name)).all()
    return [_alias(*row) for row in rows]


def _alias(namespace: str, name: str, current: int, h_base: str, hot: bool,
           digest: str | None, record: dict[str, Any] | None, tensor_bytes: int | None,
           merge_id: int | None, h_merged: str | None, merged_base: str | None) -> RouteAlias:
    record = record or {}
    modules = record.get("modules") or []
    release = None
    if merge_id is not None and h_merged is not None and merged_base is not None:
        release = DesiredRelease(id=merge_id, digest=h_merged, base=merged_base)
    return RouteAlias(namespace=namespace, alias=name, current_generation=current,
                      digest=digest, base=h_base, hot=hot, release=release,
                      nbytes=int(tensor_bytes or record.get("total_bytes") or 0),
                      rank=max((int(m.get("rank", 0)) for m in modules), default=0),
                      roles=sorted({str(m.get("role")) for m in modules}))


def _agent(a: Agent, now: datetime, assigned: frozenset[str]) -> RouteAgent:
    caps = a.capabilities
    seen = a.last_heartbeat_at or a.registered_at
    resident = {str(s["artifact_digest"]) for s in a.slots
                if s.get("artifact_digest") and s.get("state") in RESIDENT_STATES}
    loading = {str(s["artifact_digest"]) for s in a.slots
               if s.get("artifact_digest") and s.get("state") == "loading"}
    arriving = (loading | assigned) - resident
    return RouteAgent(
        id=a.id, name=a.name, url=a.url, base=a.h_base,
        served_model_name=caps.get("served_model_name"), max_rank=int(caps.get("max_rank", 0)),
        targets=[str(t) for t in caps.get("targets", [])], worker_epoch=a.worker_epoch,
        heartbeat_age_s=max(0.0, (now - seen).total_seconds()), drain=a.drain,
        drained=a.drained, resident=sorted(resident), arriving=sorted(arriving),
        load=AgentLoad.model_validate(a.load or {}))
