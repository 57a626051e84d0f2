"""Which artifact materialises which member of a fitted collection (append-only links).

Written by `POST .../collections/{ref}/members/{i}/artifact` (one row per collection and
member position). Agents that serve collections natively read it through their desired
state: an alias whose artifact is a member can be served from the collection's shared
bases, after the agent has checked that the member's factors are exactly what the bundle
materialises.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint, event
from sqlalchemy.orm import Mapped, Mapper, mapped_column, relationship

from controlplane.models.base import Base, BigId, CreatedAtMixin, IdMixin
from controlplane.models.collection import Collection


class CollectionMemberError(Exception):
    """A collection member link was changed after insert."""


class CollectionMember(IdMixin, CreatedAtMixin, Base):
    __tablename__ = "collection_members"
    __table_args__ = (
        UniqueConstraint("collection_id", "member_index"),
        Index("ix_collection_members_artifact_id", "artifact_id"),
    )

    collection_id: Mapped[int] = mapped_column(BigId, ForeignKey("collections.id"),
                                               nullable=False)
    member_index: Mapped[int] = mapped_column(nullable=False)
    artifact_id: Mapped[int] = mapped_column(BigId, ForeignKey("artifacts.id"), nullable=False)

    collection: Mapped[Collection] = relationship(lazy="joined")


@event.listens_for(CollectionMember, "before_update")
def _immutable(_mapper: Mapper[Any], _conn: Any, target: CollectionMember) -> None:
    raise CollectionMemberError(f"collection member link {target.id} is append-only")
