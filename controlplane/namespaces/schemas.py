"""Namespace bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.models.namespace import MAX_WEIGHT

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
Priority = Literal["high", "normal", "low"]


class NamespaceCreate(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="DNS-label style: a-z, 0-9, '-'.")


class NamespacePatch(BaseModel):
    """Body of `PATCH /v1/namespaces/{name}`: the namespace's scheduling policy on every
    agent (at least one field; the others keep their values)."""

    model_config = ConfigDict(extra="forbid")

    weight: float | None = Field(
        default=None, gt=0, le=MAX_WEIGHT, allow_inf_nan=False, strict=True,
        description="Share of each agent's engine against the other namespaces: waiting "
                    "requests of the namespace with the least completed weighted service "
                    "per unit of weight are admitted first. 0 < weight <= 1000.")
    priority: Priority | None = Field(
        default=None, description="Priority class: every waiting request of a more urgent "
                                  "class (high < normal < low) is admitted first.")

    @model_validator(mode="after")
    def _some_field(self) -> Self:
        if self.weight is None and self.priority is None:
            raise ValueError("give at least one of 'weight', 'priority'")
        return self


class NamespaceOut(BaseModel):
    id: int
    name: str
    weight: float = Field(description="Scheduling weight (default 1.0).")
    priority: Priority = Field(description="Scheduling priority class (default normal).")
    created_at: datetime
