"""Catalog: aliases and their append-only list of generations.

`aliases.current_generation` is the number of the newest generation (0 before the
first); it is the compare-and-swap word every publish/retire/rollback updates under a
row lock, and `(alias_id, generation)` is unique as a backstop, so generations stay
gapless and never fork. Generation rows are never updated or deleted.

`aliases.hot` is an operator's mark, independent of generations: placement keeps the
alias's current artifact resident on every compatible agent (controlplane/placement).
"""

from __future__ import annotations

import enum

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.models.artifact import Artifact
from controlplane.models.base import Base, BigId, CreatedAtMixin, IdMixin
from controlplane.models.base_model import BaseModel
from controlplane.models.merge import Merge
from controlplane.models.namespace import Namespace


class CatalogAction(enum.StrEnum):
    PUBLISH = "publish"
    RETIRE = "retire"
    ROLLBACK = "rollback"


class Alias(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("namespace_id", "name"),)

    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id"), nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    base_id: Mapped[int] = mapped_column(BigId, ForeignKey("base_models.id"), nullable=False)
    """An alias serves one base model for life (set by its first publish)."""
    current_generation: Mapped[int] = mapped_column(nullable=False, default=0)
    hot: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                      server_default=false())
    """Prefetch the current artifact on every compatible agent, whatever else placement
    would choose (set by an admin on '*': it claims adapter slots fleet-wide)."""

    namespace: Mapped[Namespace] = relationship(lazy="joined")
    base: Mapped[BaseModel] = relationship(lazy="joined")


class CatalogGeneration(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "catalog_generations"
    __table_args__ = (
        UniqueConstraint("alias_id", "generation"),
        UniqueConstraint("alias_id", "idempotency_key"),
        CheckConstraint("artifact_id IS NULL OR merge_id IS NULL",
                        name="ck_catalog_generations_one_target"),
        Index("ix_catalog_generations_merge_id", "merge_id"),
    )

    alias_id: Mapped[int] = mapped_column(BigId, ForeignKey("aliases.id"), nullable=False)
    generation: Mapped[int] = mapped_column(nullable=False)
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    artifact_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("artifacts.id"))
    """The artifact the alias means from this generation on (None for a release or a
    retire)."""
    merge_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("merges.id"))
    """The merged release the alias means from this generation on: requests are served by
    agents of the release's base with no adapter. At most one of the two targets is set;
    neither: a retire."""
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_sha256: Mapped[str | None] = mapped_column(String(64))

    alias: Mapped[Alias] = relationship(lazy="joined")
    artifact: Mapped[Artifact | None] = relationship(lazy="joined")
    merge: Mapped[Merge | None] = relationship(lazy="joined")

    @property
    def target(self) -> tuple[int | None, int | None]:
        """(artifact_id, merge_id): what the alias serves from here on; both None: retired."""
        return self.artifact_id, self.merge_id
