"""The audit log with filters (namespace, actor, action prefix, time range)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from controlplane.console.rendering import render
from controlplane.console.route import ConsoleRoute
from controlplane.console.session import CONSOLE_PREFIX, ConsolePrincipal
from controlplane.console.views.audit import AuditFilters, audit_page, parse_time
from controlplane.kit.deps import SessionDep
from controlplane.kit.pagination import PageParams

router = APIRouter(prefix=CONSOLE_PREFIX, route_class=ConsoleRoute, include_in_schema=False)
Filter = Annotated[str | None, Query(max_length=200)]
PAGE = 100


@router.get("/audit")
def audit(request: Request, principal: ConsolePrincipal, session: SessionDep,
          namespace: Filter = None, actor: Filter = None, action: Filter = None,
          since: Filter = None, until: Filter = None, cursor: Filter = None) -> Response:
    filters = AuditFilters(namespace=namespace or None, actor=actor or None,
                           action=action or None, since=parse_time("since", since),
                           until=parse_time("until", until))
    page = audit_page(session, principal, filters, PageParams(PAGE, cursor or None))
    return render(request, "audit.html", {
        "page": page, "raw": {"namespace": namespace or "", "actor": actor or "",
                              "action": action or "", "since": since or "",
                              "until": until or ""}})
