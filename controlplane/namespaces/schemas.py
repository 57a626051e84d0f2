"""Namespace bodies."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class NamespaceCreate(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="DNS-label style: a-z, 0-9, '-'.")


class NamespaceOut(BaseModel):
    id: int
    name: str
    created_at: datetime
