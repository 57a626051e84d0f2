"""Audit bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class AuditOut(BaseModel):
    id: int
    actor: str
    action: str
    namespace: str | None
    target: str
    detail: dict[str, Any]
    created_at: datetime
