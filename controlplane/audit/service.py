"""Write audit rows inside the caller's transaction (never committed on their own)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controlplane.models import AuditEntry


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str,
    namespace: str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """Add one audit row to the current transaction; it commits or rolls back with it.

    `action` is `<domain>.<verb>` (e.g. `catalog.publish`, `artifact.validated`).
    """
    entry = AuditEntry(actor=actor, action=action, namespace=namespace, target=target,
                       detail=dict(detail or {}))
    session.add(entry)
    return entry
