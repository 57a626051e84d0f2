"""Collections: a Compress-then-Serve fit of an ordered set of validated artifacts.

Request columns (namespace, base, name, ordered sources, spec, request digest) never
change after insert. Result columns (H_collection, bundle files, assignment, metrics) are
written exactly once, on `fitting -> fitted`. States: `pending -> fitting -> fitted |
rejected` (`fitting -> fitting` is a re-claim by a redelivered job). A rejected fit keeps
its metrics when the release threshold refused it.
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


class CollectionState(enum.StrEnum):
    PENDING = "pending"
    FITTING = "fitting"
    FITTED = "fitted"
    REJECTED = "rejected"


COLLECTION_TRANSITIONS: dict[CollectionState, frozenset[CollectionState]] = {
    CollectionState.PENDING: frozenset({CollectionState.FITTING}),
    CollectionState.FITTING: frozenset(
        {CollectionState.FITTING, CollectionState.FITTED, CollectionState.REJECTED}),
    CollectionState.FITTED: frozenset(),
    CollectionState.REJECTED: frozenset(),
}
REQUEST_COLUMNS = ("namespace_id", "base_id", "name", "sources", "spec", "request_sha256",
                   "created_at")
RESULT_COLUMNS = ("digest", "storage_key", "files", "assignment", "size_bytes", "fitted_at")


class CollectionStateError(Exception):
    """An illegal state transition or a write to an immutable column."""


class Collection(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "collections"
    __table_args__ = (
        UniqueConstraint("namespace_id", "request_sha256"),
        Index("ix_collections_namespace_id_id", "namespace_id", "id"),
        Index("ix_collections_state", "state"),  # the job gauges and the reaper
    )

    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id"), nullable=False)
    base_id: Mapped[int] = mapped_column(BigId, ForeignKey("base_models.id"), nullable=False)
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    sources: Mapped[list[Any]] = mapped_column(JsonDoc, nullable=False)
    """Ordered `[{"artifact_id": int, "digest": H_artifact}]`: member i is sources[i]."""
    spec: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    request_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    """Digest of (H_base, ordered source digests, spec): the same request is one row."""
    created_by: Mapped[str] = mapped_column(String(200), nullable=False)

    state: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    fit_attempts: Mapped[int] = mapped_column(nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)

    digest: Mapped[str | None] = mapped_column(String(64))
    """H_collection of the emitted bundle."""
    storage_key: Mapped[str | None] = mapped_column(String(300))
    files: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    assignment: Mapped[list[Any] | None] = mapped_column(JsonDoc)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    fitted_at: Mapped[datetime | None] = mapped_column()

    rejection_code: Mapped[str | None] = mapped_column(String(64))
    rejection_message: Mapped[str | None] = mapped_column(Text)
    rejection_detail: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)

    namespace: Mapped[Namespace] = relationship(lazy="joined")
    base: Mapped[BaseModel] = relationship(lazy="joined")

    def transition(self, to: CollectionState) -> None:
        current = CollectionState(self.state)
        if to not in COLLECTION_TRANSITIONS[current]:
            raise CollectionStateError(f"collection {self.id}: {current} -> {to} is not allowed")
        self.state = to.value


@event.listens_for(Collection, "before_update")
def _guard_collection_update(_mapper: Mapper[Any], _conn: Any, target: Collection) -> None:
    guard_update(target, noun="collection", immutable=REQUEST_COLUMNS,
                 write_once=(*RESULT_COLUMNS, "metrics"), states=CollectionState,
                 transitions=COLLECTION_TRANSITIONS, error=CollectionStateError)
