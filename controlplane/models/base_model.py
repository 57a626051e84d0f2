"""Registered base models, keyed by their content digest H_base."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base, CreatedAtMixin, IdMixin, JsonDoc


class BaseModel(IdMixin, CreatedAtMixin, Base):
    """A base model ABI record (`dataplane.artifacts.BaseModelABI.to_record()`)."""

    __tablename__ = "base_models"

    h_base: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    architecture: Mapped[str | None] = mapped_column(String(200))
    abi: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
