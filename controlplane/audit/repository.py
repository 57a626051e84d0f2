"""Audit queries."""

from __future__ import annotations

from sqlalchemy import Select, select

from controlplane.kit.repository import Repository
from controlplane.models import AuditEntry


class AuditRepository(Repository[AuditEntry]):
    model = AuditEntry
    noun = "audit entry"

    def query(self, namespace: str | None) -> Select[AuditEntry]:
        stmt = select(AuditEntry)
        if namespace is not None:
            stmt = stmt.where(AuditEntry.namespace == namespace)
        return stmt
