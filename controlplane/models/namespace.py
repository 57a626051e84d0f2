"""Namespaces: the unit of ownership and authorization for artifacts and aliases, and
the tenant of the agents' schedulers (weight and priority class, docs/API.md)."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base, CreatedAtMixin, IdMixin

PRIORITIES = ("high", "normal", "low")
"""Priority classes, most urgent first (the engine's classes 0, 1, 2)."""
DEFAULT_PRIORITY = "normal"
DEFAULT_WEIGHT = 1.0
MAX_WEIGHT = 1000.0


class Namespace(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "namespaces"
    __table_args__ = (
        CheckConstraint(f"weight > 0 AND weight <= {MAX_WEIGHT:g}", name="weight_range"),
        CheckConstraint("priority IN ('high', 'normal', 'low')", name="priority_class"),
    )

    name: Mapped[str] = mapped_column(String(63), unique=True, nullable=False)
    weight: Mapped[float] = mapped_column(Float, nullable=False, default=DEFAULT_WEIGHT,
                                          server_default="1.0")
    """Share of an agent's engine against the other namespaces (0 < weight <= 1000)."""
    priority: Mapped[str] = mapped_column(String(16), nullable=False,
                                          default=DEFAULT_PRIORITY, server_default="normal")
    """Scheduling class: high, normal or low (a more urgent class is admitted first)."""
    policy_revision: Mapped[int] = mapped_column(nullable=False, default=1,
                                                 server_default="1")
    """1 at creation, +1 per weight/priority change and per hot-mark change of one of its
    aliases: the sum over all namespaces is the tenant-policy version agents long-poll on
    (controlplane/agents), so either change wakes them."""
