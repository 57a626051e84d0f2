"""Audit log: one row per mutation, written in the mutation's own transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base, CreatedAtMixin, IdMixin, JsonDoc


class AuditEntry(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_namespace_id", "namespace", "id"),)

    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    namespace: Mapped[str | None] = mapped_column(String(63))
    target: Mapped[str] = mapped_column(String(300), nullable=False)
    detail: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False, default=dict)
