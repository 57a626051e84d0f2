"""API tokens: only the SHA-256 of the plaintext is stored."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base, CreatedAtMixin, IdMixin, JsonDoc


class ApiToken(IdMixin, CreatedAtMixin, Base):
    """`grants` is a list of `{"namespace": name | "*", "role": read|publish|admin}`."""

    __tablename__ = "api_tokens"

    name: Mapped[str] = mapped_column(String(200), nullable=False)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    grants: Mapped[list[dict[str, Any]]] = mapped_column(JsonDoc, nullable=False)
    is_agent: Mapped[bool] = mapped_column(default=False, nullable=False)
    revoked: Mapped[bool] = mapped_column(default=False, nullable=False)
