"""Base placement: which merged release an agent serves as its base.

An admin on `*` assigns an agent a merged release (`POST /v1/agents/{id}/release`,
`adapterctl agents assign NAME --release NS/MERGE`) or clears the assignment (`DELETE`,
`--clear`). The agent learns of it from its next heartbeat answer (`release_base`): an
agent serving another base drains (routers stop sending it requests, in-flight ones
finish), restarts itself and loads the release's checkpoint, and registers again with
the release's H_base; from then on routing and desired state treat it as an agent of
that base. Cleared, it returns the same way to the base it is configured with.

Rules, each a typed refusal that changes nothing:

* the merge must be `merged` (INVALID_STATE) and every checkpoint file intact in
  object storage (ARTIFACT_CORRUPT, each file re-read as a publish does), so an agent is
  never told to restart onto a release it cannot load;
* the release must be of the agent's model (BASE_MISMATCH): made from the base the agent
  serves, or, when it serves a merged release now, from that release's source base. An
  agent moves between the releases of one base and back, never to another model (its
  tokenizer, architecture and memory plan were chosen for that one).

Assigning what is already assigned, or clearing nothing, changes nothing; every call is
audited.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from controlplane.agents.service import get_agent
from controlplane.audit.service import record_audit
from controlplane.bases.repository import BaseModelRepository
from controlplane.catalog.service import verify_artifact_blobs
from controlplane.contracts import AgentRelease
from controlplane.db import begin_write
from controlplane.errors import BaseMismatch, InvalidState
from controlplane.merges.repository import MergeRepository
from controlplane.models import MergeState
from controlplane.models.agent import Agent
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ObjectStore


def agent_release(agent: Agent) -> AgentRelease | None:
    merge = agent.release
    if merge is None or merge.digest is None or merge.merged_base is None:
        return None
    return AgentRelease(id=merge.id, namespace=merge.namespace.name, name=merge.name,
                        digest=merge.digest, base=merge.merged_base.h_base)


def release_base(agent: Agent) -> str | None:
    """H_base the agent is assigned to serve (None: its configured base)."""
    release = agent_release(agent)
    return None if release is None else release.base


def assign_release(session: Session, store: ObjectStore, agent_id: int, namespace: str,
                   ref: str, actor: str) -> Agent:
    """Assign agent `agent_id` merge `ref` of `namespace` (see module docstring). Commits."""
    agent = get_agent(session, agent_id)
    ns = NamespaceRepository(session).get_by_name(namespace)
    merge = MergeRepository(session).get_by_ref(ns.id, ref)
    if merge.state != MergeState.MERGED.value or merge.merged_base is None:
        raise InvalidState(f"merge {merge.id} is {merge.state}, not merged",
                           detail={"merge_id": merge.id, "state": merge.state})
    family = _model_of(session, agent)
    if merge.base_id != family:
        raise BaseMismatch(
            f"merge {merge.id} was made from another base than agent {agent.name!r} serves",
            detail={"agent": agent.name, "agent_base": agent.h_base,
                    "release_source_base": merge.base.h_base})
    merge_id, files = merge.id, dict(merge.files or {})
    session.rollback()  # read the checkpoint back outside any transaction
    verify_artifact_blobs(store, merge_id, files, noun="release")
    return _set(session, agent_id, merge_id, actor)


def clear_release(session: Session, agent_id: int, actor: str) -> Agent:
    """Clear the agent's assignment: it serves its configured base again. Commits."""
    return _set(session, agent_id, None, actor)


def _set(session: Session, agent_id: int, merge_id: int | None, actor: str) -> Agent:
    begin_write(session)
    agent = get_agent(session, agent_id)
    was = agent.release_id
    agent.release_id = merge_id
    record_audit(session, actor=actor,
                 action="agent.assign" if merge_id is not None else "agent.unassign",
                 namespace=None, target=f"agent:{agent.name}",
                 detail={"merge_id": merge_id, "was": was})
    session.commit()
    session.refresh(agent)
    return agent


def _model_of(session: Session, agent: Agent) -> int | None:
    """The base id an agent's releases must be made from: the source base of the release
    it serves now, or the base it serves (None: a base the registry does not know)."""
    served = BaseModelRepository(session).by_h_base(agent.h_base)
    if served is None:
        return None
    producing = MergeRepository(session).producing(served.id)
    return producing[0].base_id if producing else served.id
