"""Blob leases: how a writer fences garbage collection off a blob it is about to use.

A writer (artifact push, collection fit) calls `lease_blob` for every blob once its
digest is known and *before* the store is asked whether the blob is already there (the
`claim` hook of `ObjectStore.put_blob`); its row referencing the blob commits later.
The collector takes the same row's lock with `hold_for_removal` before it re-checks
references and deletes the blob, so the two serialise on one database row: either the
lease is visible to the collector (it keeps the blob), or the writer's lease waits for
the collector's commit and then finds the blob gone and uploads it again. The argument
is written out in docs/ARCHITECTURE.md ("Retention and blob GC").

On Postgres the rows are upserted (`INSERT ... ON CONFLICT`) and locked `FOR UPDATE`;
on SQLite every write transaction holds the database write lock (`begin_write`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import begin_write, session_scope
from controlplane.models import BlobLease, utcnow
from controlplane.storage import BlobClaim, BlobRef

NEVER = datetime(1970, 1, 1, tzinfo=UTC)
"""`leased_at` of the placeholder row the collector inserts to lock a key no writer
leased: older than any cutoff, and never committed (rolled back or deleted)."""


def _insert(session: Session) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(BlobLease)


def lease_blob(session: Session, key: str, now: datetime | None = None) -> None:
    """Record (or refresh) the lease on `key` in a transaction of its own, committed."""
    begin_write(session)
    stmt = _insert(session).values(key=key, leased_at=now or utcnow())
    session.execute(stmt.on_conflict_do_update(index_elements=[BlobLease.key],
                                               set_={"leased_at": stmt.excluded.leased_at}))
    session.commit()


def session_lease(session: Session) -> BlobClaim:
    """A `put_blob` claim that leases each blob through `session` (between its
    transactions: it commits)."""
    return lambda ref: lease_blob(session, ref.key)


def factory_lease(factory: sessionmaker[Session]) -> BlobClaim:
    """A `put_blob` claim that leases each blob in a session of its own."""

    def lease(ref: BlobRef) -> None:
        with session_scope(factory) as session:
            lease_blob(session, ref.key)

    return lease


def hold_for_removal(session: Session, key: str) -> datetime:
    """Lock `key`'s lease row inside the caller's write transaction (inserting a
    placeholder when there is none) and return its `leased_at`; a writer's `lease_blob`
    on the key then waits until the caller's transaction ends."""
    begin_write(session)
    session.execute(_insert(session).values(key=key, leased_at=NEVER)
                    .on_conflict_do_nothing(index_elements=[BlobLease.key]))
    leased_at: datetime = session.scalars(
        select(BlobLease.leased_at).where(BlobLease.key == key).with_for_update()).one()
    return leased_at


def leased_since(session: Session, key: str, cutoff: datetime) -> bool:
    """Whether `key` has a lease taken at or after `cutoff` (a read, no lock)."""
    return session.scalar(select(BlobLease.key).where(
        BlobLease.key == key, BlobLease.leased_at >= cutoff)) is not None


def drop_lease(session: Session, key: str) -> None:
    session.execute(delete(BlobLease).where(BlobLease.key == key))


def purge_leases(session: Session, cutoff: datetime) -> int:
    """Delete the leases older than `cutoff` in the caller's transaction; their count."""
    result = session.execute(delete(BlobLease).where(BlobLease.leased_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
