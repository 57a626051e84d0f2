"""Base-model bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class BaseCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    abi: dict[str, Any] = Field(description="`dataplane.artifacts.BaseModelABI.to_record()`")


class BaseOut(BaseModel):
    id: int
    name: str
    h_base: str
    architecture: str | None
    abi: dict[str, Any]
    created_at: datetime
