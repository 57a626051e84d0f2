"""The audit log page: newest first, filtered by namespace, actor, action and time.

Scope as `GET /v1/audit`: admin on `*` for everything, admin on a namespace for that
namespace's rows. `action` matches a prefix (`catalog` finds every catalog verb,
`catalog.rollback` that one); times are UTC, `since` inclusive and `until` exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from controlplane.audit.endpoints import audit_out
from controlplane.audit.repository import AuditRepository
from controlplane.audit.schemas import AuditOut
from controlplane.auth.scopes import Principal, Role
from controlplane.errors import BadRequest
from controlplane.kit.pagination import PageParams
from controlplane.models import AuditEntry


@dataclass(frozen=True)
class AuditFilters:
    namespace: str | None = None
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class AuditPage:
    filters: AuditFilters
    items: list[AuditOut]
    next_cursor: str | None


def parse_time(name: str, value: str | None) -> datetime | None:
    """`2026-01-02T03:04[:05]` (a `datetime-local` field), read as UTC; 422 otherwise."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadRequest(f"invalid {name} time {value!r}: expected YYYY-MM-DDTHH:MM",
                         detail={"field": name, "value": value}) from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _like_prefix(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}%"


def audit_page(session: Session, principal: Principal, filters: AuditFilters,
               params: PageParams) -> AuditPage:
    if filters.namespace is None:
        principal.require_global(Role.ADMIN)
    else:
        principal.require(filters.namespace, Role.ADMIN)
    repo = AuditRepository(session)
    stmt = repo.query(filters.namespace)
    if filters.actor:
        stmt = stmt.where(AuditEntry.actor == filters.actor)
    if filters.action:
        stmt = stmt.where(AuditEntry.action.like(_like_prefix(filters.action), escape="\\"))
    if filters.since is not None:
        stmt = stmt.where(AuditEntry.created_at >= filters.since)
    if filters.until is not None:
        stmt = stmt.where(AuditEntry.created_at < filters.until)
    page = repo.paginate(stmt, key=AuditEntry.id, params=params, descending=True)
    return AuditPage(filters, [audit_out(e) for e in page.items], page.next_cursor)
