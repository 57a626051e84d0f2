"""Merged releases: an ordered set of validated adapters merged into their base, released as
a new base revision (a `base_models` row) with its lineage.

Request columns (namespace, source base, name, ordered adapters with weights, dtype,
spec, base checkpoint URI, request digest) never change after insert. Result columns
(H_merged, manifest, files, the merged base) are written exactly once, on
`merging -> merged`. States: `pending -> merging -> merged | rejected` (`merging ->
merging` is a re-claim by a redelivered job). A release refused by the exactness gate
keeps its metrics.
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


class MergeState(enum.StrEnum):
    PENDING = "pending"
    MERGING = "merging"
    MERGED = "merged"
    REJECTED = "rejected"


MERGE_TRANSITIONS: dict[MergeState, frozenset[MergeState]] = {
    MergeState.PENDING: frozenset({MergeState.MERGING}),
    MergeState.MERGING: frozenset({MergeState.MERGING, MergeState.MERGED, MergeState.REJECTED}),
    MergeState.MERGED: frozenset(),
    MergeState.REJECTED: frozenset(),
}
REQUEST_COLUMNS = ("namespace_id", "base_id", "name", "adapters", "dtype", "spec", "base_uri",
                   "request_sha256", "created_at")
RESULT_COLUMNS = ("digest", "manifest", "storage_key", "files", "size_bytes",
                  "merged_base_id", "merged_at")


class MergeStateError(Exception):
    """An illegal state transition or a write to an immutable column."""


class Merge(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "merges"
    __table_args__ = (
        UniqueConstraint("namespace_id", "request_sha256"),
        Index("ix_merges_namespace_id_id", "namespace_id", "id"),
        Index("ix_merges_merged_base_id", "merged_base_id"),
    )

    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id"), nullable=False)
    base_id: Mapped[int] = mapped_column(BigId, ForeignKey("base_models.id"), nullable=False)
    """The source base every adapter was validated against."""
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    adapters: Mapped[list[Any]] = mapped_column(JsonDoc, nullable=False)
    """Ordered `[{"artifact_id": int, "digest": H_artifact, "weight": "p/q"}]`."""
    dtype: Mapped[str] = mapped_column(String(8), nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonDoc, nullable=False)
    """`{"max_relative_error": "p/q"}`: the exactness gate's threshold."""
    base_uri: Mapped[str] = mapped_column(String(1000), nullable=False)
    """Where the worker reads the source base checkpoint (checked against H_base)."""
    request_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    """Digest of (H_base, ordered adapter digests and weights, dtype, spec)."""
    created_by: Mapped[str] = mapped_column(String(200), nullable=False)

    state: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    merge_attempts: Mapped[int] = mapped_column(nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)

    digest: Mapped[str | None] = mapped_column(String(64))
    """H_merged."""
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    storage_key: Mapped[str | None] = mapped_column(String(300))
    files: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    merged_base_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("base_models.id"))
    merged_at: Mapped[datetime | None] = mapped_column()

    rejection_code: Mapped[str | None] = mapped_column(String(64))
    rejection_message: Mapped[str | None] = mapped_column(Text)
    rejection_detail: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)

    namespace: Mapped[Namespace] = relationship(lazy="joined")
    base: Mapped[BaseModel] = relationship(lazy="joined", foreign_keys=[base_id])
    merged_base: Mapped[BaseModel | None] = relationship(lazy="joined",
                                                         foreign_keys=[merged_base_id])

    def transition(self, to: MergeState) -> None:
        current = MergeState(self.state)
        if to not in MERGE_TRANSITIONS[current]:
            raise MergeStateError(f"merge {self.id}: {current} -> {to} is not allowed")
        self.state = to.value


@event.listens_for(Merge, "before_update")
def _guard_merge_update(_mapper: Mapper[Any], _conn: Any, target: Merge) -> None:
    guard_update(target, noun="merge", immutable=REQUEST_COLUMNS,
                 write_once=(*RESULT_COLUMNS, "metrics"), states=MergeState,
                 transitions=MERGE_TRANSITIONS, error=MergeStateError)
