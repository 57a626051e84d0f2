"""/v1/namespaces: create (admin on '*'), list (namespaces the token can read), and
PATCH a namespace's scheduling policy (weight, priority class; admin on '*')."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import Namespace
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.namespaces.schemas import NamespaceCreate, NamespaceOut, NamespacePatch
from controlplane.namespaces.service import create_namespace, set_policy

router = APIRouter(prefix="/v1/namespaces", tags=["namespaces"])


def namespace_out(ns: Namespace) -> NamespaceOut:
    return NamespaceOut.model_validate({"id": ns.id, "name": ns.name, "weight": ns.weight,
                                        "priority": ns.priority, "created_at": ns.created_at})


@router.post("", status_code=status.HTTP_201_CREATED, response_model=NamespaceOut)
def post_namespace(body: NamespaceCreate, principal: CurrentPrincipal,
                   session: SessionDep) -> NamespaceOut:
    principal.require_global(Role.ADMIN)
    return namespace_out(create_namespace(session, name=body.name, actor=principal.actor))


@router.patch("/{name}", response_model=NamespaceOut)
def patch_namespace(name: Annotated[str, Path(max_length=63)], body: NamespacePatch,
                    principal: CurrentPrincipal, session: SessionDep) -> NamespaceOut:
    """Set the namespace's scheduling weight and/or priority class on every agent.

    Admin on '*' only: a weight is a share *against the other namespaces*, so a
    namespace's own admin may not raise it. Audited; agents apply it on their next poll.
    """
    principal.require_global(Role.ADMIN)
    return namespace_out(set_policy(session, name=name, actor=principal.actor,
                                    weight=body.weight, priority=body.priority))


@router.get("", response_model=PageOut[NamespaceOut])
def list_namespaces(principal: CurrentPrincipal, session: SessionDep,
                    params: Annotated[PageParams, Depends(page_params)]) -> dict[str, Any]:
    """Namespaces the token can read (all of them for '*' grants and agents)."""
    repo = NamespaceRepository(session)
    stmt = repo.select()
    if not principal.can_global(Role.READ):
        visible = [g.namespace for g in principal.grants]
        stmt = stmt.where(Namespace.name.in_(visible))
    return page_out(repo.paginate(stmt, key=Namespace.id, params=params), namespace_out)
