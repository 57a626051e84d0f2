"""GET /v1/audit: admin on '*' (everything) or admin on `?namespace=` (that namespace)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from controlplane.audit.repository import AuditRepository
from controlplane.audit.schemas import AuditOut
from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageOut, PageParams, page_out, page_params
from controlplane.models import AuditEntry

router = APIRouter(prefix="/v1/audit", tags=["audit"])


def audit_out(e: AuditEntry) -> AuditOut:
    return AuditOut(id=e.id, actor=e.actor, action=e.action, namespace=e.namespace,
                    target=e.target, detail=e.detail, created_at=e.created_at)


@router.get("", response_model=PageOut[AuditOut])
def list_audit(principal: CurrentPrincipal, session: SessionDep,
               params: Annotated[PageParams, Depends(page_params)],
               namespace: Annotated[str | None, Query()] = None) -> dict[str, Any]:
    """Newest first."""
    if namespace is None:
        principal.require_global(Role.ADMIN)
    else:
        principal.require(namespace, Role.ADMIN)
    repo = AuditRepository(session)
    page = repo.paginate(repo.query(namespace), key=AuditEntry.id,
                         params=params, descending=True)
    return page_out(page, audit_out)
