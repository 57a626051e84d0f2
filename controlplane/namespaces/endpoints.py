"""/v1/namespaces: create (admin on '*'), list (namespaces the token can read)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import Namespace
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.namespaces.schemas import NamespaceCreate, NamespaceOut
from controlplane.namespaces.service import create_namespace

router = APIRouter(prefix="/v1/namespaces", tags=["namespaces"])


def namespace_out(ns: Namespace) -> NamespaceOut:
    return NamespaceOut(id=ns.id, name=ns.name, created_at=ns.created_at)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=NamespaceOut)
def post_namespace(body: NamespaceCreate, principal: CurrentPrincipal,
                   session: SessionDep) -> NamespaceOut:
    principal.require_global(Role.ADMIN)
    return namespace_out(create_namespace(session, name=body.name, actor=principal.actor))


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
