"""POST /v1/gc: one blob garbage-collection pass on demand (admin on `*`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from controlplane.auth.dependencies import CurrentPrincipal
from controlplane.auth.scopes import Role
from controlplane.kit.deps import SessionDep, SettingsDep, StoreDep
from controlplane.retention.collector import collect_garbage
from controlplane.retention.schemas import GcReport, GcRequest

router = APIRouter(prefix="/v1/gc", tags=["retention"])


@router.post("", response_model=GcReport)
def run_gc(principal: CurrentPrincipal, session: SessionDep, store: StoreDep,
           settings: SettingsDep,
           body: Annotated[GcRequest | None, Body()] = None) -> GcReport:
    """Remove the blobs no row references, written and leased longer than
    `ADAPTERPLANE_GC_GRACE_S` ago (`{"dry_run": true}`: report them, remove nothing).
    A real pass is audited (`gc.run`)."""
    principal.require_global(Role.ADMIN)
    request = body or GcRequest()
    return collect_garbage(session, store, settings, dry_run=request.dry_run,
                           actor=principal.actor)
