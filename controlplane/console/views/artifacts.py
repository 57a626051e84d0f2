"""Artifact pages: a namespace's artifacts (state, rejection code, identities, sizes) and
one artifact in full, through the API's own conversion (`artifact_out`)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from controlplane.artifacts.convert import artifact_out
from controlplane.artifacts.repository import ArtifactRepository
from controlplane.artifacts.schemas import ArtifactOut
from controlplane.auth.scopes import Principal, Role
from controlplane.errors import BadRequest
from controlplane.kit.pagination import PageParams
from controlplane.models import Artifact, ArtifactState
from controlplane.namespaces.repository import NamespaceRepository

STATES = tuple(state.value for state in ArtifactState)


@dataclass(frozen=True)
class ArtifactList:
    namespace: str
    state: str | None
    items: list[ArtifactOut]
    next_cursor: str | None


def artifact_list(session: Session, principal: Principal, namespace: str, state: str | None,
                  params: PageParams) -> ArtifactList:
    """Newest first, optionally of one state (422 VALIDATION_ERROR for an unknown one)."""
    principal.require(namespace, Role.READ)
    if state is not None and state not in STATES:
        raise BadRequest(f"unknown artifact state {state!r}",
                         detail={"state": state, "allowed": list(STATES)})
    ns = NamespaceRepository(session).get_by_name(namespace)
    repo = ArtifactRepository(session)
    page = repo.paginate(repo.in_namespace(ns.id, state), key=Artifact.id, params=params,
                         descending=True)
    return ArtifactList(namespace, state, [artifact_out(a) for a in page.items],
                        page.next_cursor)


def artifact_detail(session: Session, principal: Principal, namespace: str,
                    ref: str) -> ArtifactOut:
    """One artifact by id or `sha256:<H_artifact>` (404 NOT_FOUND otherwise)."""
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    return artifact_out(ArtifactRepository(session).get_by_ref(ns.id, ref))
