"""Namespaces: the unit of ownership and authorization for artifacts and aliases."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base, CreatedAtMixin, IdMixin


class Namespace(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "namespaces"

    name: Mapped[str] = mapped_column(String(63), unique=True, nullable=False)
