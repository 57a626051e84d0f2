"""Artifacts: immutable adapter bytes plus their validation outcome.

Content columns (namespace, base, upload digest, storage key, files, size) never
change after insert. Validation columns (digest H_artifact, method, modules, tensor
bytes) are filled exactly once, on the transition to `validated`. The state machine
is `pending -> validating -> validated | rejected` (`validating -> validating` is a
re-claim by a retried or redelivered job). Both rules are enforced on flush, one
transition per flush (the guard compares with the value last loaded or flushed).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, UniqueConstraint, event
from sqlalchemy.orm import Mapped, Mapper, mapped_column, relationship

from controlplane.models.base import Base, BigId, CreatedAtMixin, IdMixin, JsonDoc
from controlplane.models.base_model import BaseModel
from controlplane.models.guards import guard_update
from controlplane.models.namespace import Namespace


class ArtifactState(enum.StrEnum):
    PENDING = "pending"
    VALIDATING = "validating"
    VALIDATED = "validated"
    REJECTED = "rejected"


ALLOWED_TRANSITIONS: dict[ArtifactState, frozenset[ArtifactState]] = {
    ArtifactState.PENDING: frozenset({ArtifactState.VALIDATING}),
    ArtifactState.VALIDATING: frozenset(
        {ArtifactState.VALIDATING, ArtifactState.VALIDATED, ArtifactState.REJECTED}
    ),
    ArtifactState.VALIDATED: frozenset(),
    ArtifactState.REJECTED: frozenset(),
}

IMMUTABLE_COLUMNS = (
    "namespace_id", "base_id", "upload_sha256", "storage_key", "files", "size_bytes",
    "created_at",
)
WRITE_ONCE_COLUMNS = (
    "digest", "method", "modules", "tensor_bytes", "validated_record", "validated_at",
)


class ArtifactStateError(Exception):
    """An illegal state transition or a write to an immutable column."""


class Artifact(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("namespace_id", "base_id", "upload_sha256"),
        Index("ix_artifacts_namespace_id_id", "namespace_id", "id"),
        Index("ix_artifacts_namespace_id_digest", "namespace_id", "digest"),
        Index("ix_artifacts_state", "state"),  # the job gauges and the reaper
    )

    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id"), nullable=False)
    base_id: Mapped[int] = mapped_column(BigId, ForeignKey("base_models.id"), nullable=False)
    upload_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    """SHA-256 of the upload manifest (canonical JSON of file name -> blob digest)."""
    storage_key: Mapped[str] = mapped_column(String(300), nullable=False)
    """Object-store key of the manifest; each file is a blob `blobs/sha256/<hex>`."""
    files: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    """`{file name: {"sha256": hex, "size": bytes, "key": object key}}`."""
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_by: Mapped[str] = mapped_column(String(200), nullable=False)

    state: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    validation_attempts: Mapped[int] = mapped_column(nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)

    digest: Mapped[str | None] = mapped_column(String(64))
    method: Mapped[str | None] = mapped_column(String(32))
    modules: Mapped[list[Any] | None] = mapped_column(JsonDoc)
    tensor_bytes: Mapped[int | None] = mapped_column(BigInteger)
    validated_record: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    """`dataplane.artifacts.ValidatedArtifact.to_record()`: re-derivable by its readers."""
    validated_at: Mapped[datetime | None] = mapped_column()

    rejection_code: Mapped[str | None] = mapped_column(String(64))
    rejection_message: Mapped[str | None] = mapped_column(Text)
    rejection_detail: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)

    namespace: Mapped[Namespace] = relationship(lazy="joined")
    base: Mapped[BaseModel] = relationship(lazy="joined")

    def transition(self, to: ArtifactState) -> None:
        current = ArtifactState(self.state)
        if to not in ALLOWED_TRANSITIONS[current]:
            raise ArtifactStateError(f"artifact {self.id}: {current} -> {to} is not allowed")
        self.state = to.value


@event.listens_for(Artifact, "before_update")
def _guard_artifact_update(_mapper: Mapper[Any], _conn: Any, target: Artifact) -> None:
    guard_update(target, noun="artifact", immutable=IMMUTABLE_COLUMNS,
                 write_once=WRITE_ONCE_COLUMNS, states=ArtifactState,
                 transitions=ALLOWED_TRANSITIONS, error=ArtifactStateError)
