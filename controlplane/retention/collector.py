"""One pass of blob garbage collection over the object store's `blobs/sha256/` keys.

A blob is removed when all of these hold: its last write in the store is older than
`gc_grace_s`; no artifact or collection row references it; and no push or fit leased
it within `gc_grace_s` (controlplane/retention/leases.py). The pass lists the blobs,
reads every referenced key once to skip the referenced majority cheaply, and then, for
each remaining candidate, in one short write transaction: locks the key's lease row,
re-checks the lease and the references, deletes the object, drops the lease row and
commits. Deleting inside that transaction is what makes a concurrent push of the same
digest safe (docs/ARCHITECTURE.md, "Retention and blob GC").

Other prefixes (anything not `blobs/sha256/<64 hex>`, e.g. a `put_file` temp file) are
never touched. A storage error while deleting ends the pass (the blob is kept: its
transaction rolls back); the next pass takes up what is left.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy.orm import Session

from controlplane.audit.service import record_audit
from controlplane.config import Settings
from controlplane.db import begin_write
from controlplane.models import utcnow
from controlplane.retention.leases import (
    drop_lease,
    hold_for_removal,
    leased_since,
    purge_leases,
)
from controlplane.retention.references import is_referenced, referenced_keys
from controlplane.retention.schemas import GcReport, RemovedBlob
from controlplane.storage import BLOB_PREFIX, ObjectStore, StoredObject

BLOB_KEY = re.compile(re.escape(BLOB_PREFIX) + r"[0-9a-f]{64}")
AUDITED_KEYS = 100
"""The audit row of a pass lists at most this many removed keys (all are counted)."""

Outcome = Literal["removed", "leased", "referenced", "gone"]


def collect_garbage(session: Session, store: ObjectStore, settings: Settings, *,
                    dry_run: bool, actor: str, now: datetime | None = None) -> GcReport:
    """Run one pass (or report what it would remove); a real pass writes one audit row
    `gc.run`. `session` is used for a sequence of short transactions, none left open."""
    cutoff = (now or utcnow()) - timedelta(seconds=settings.gc_grace_s)
    listed = [obj for obj in store.list_objects(BLOB_PREFIX) if BLOB_KEY.fullmatch(obj.key)]
    referenced = referenced_keys(session)
    session.rollback()
    old = [obj for obj in listed if obj.modified_at < cutoff]
    candidates = [obj for obj in old if obj.key not in referenced]
    counts = {"removed": 0, "leased": 0, "referenced": len(old) - len(candidates), "gone": 0}
    removed: list[RemovedBlob] = []
    for obj in candidates:
        outcome = _would_remove(session, obj, cutoff) if dry_run else _remove(
            session, store, obj, cutoff)
        counts[outcome] += 1
        if outcome == "removed":
            removed.append(RemovedBlob(key=obj.key, size_bytes=obj.size,
                                       modified_at=obj.modified_at))
    purged = 0 if dry_run else _purge_and_audit(session, store, actor, cutoff, removed)
    return GcReport(dry_run=dry_run, grace_s=settings.gc_grace_s, scanned=len(listed),
                    removed=removed, removed_bytes=sum(r.size_bytes for r in removed),
                    kept_referenced=counts["referenced"],
                    kept_recent=len(listed) - len(old), kept_leased=counts["leased"],
                    leases_purged=purged)


def _would_remove(session: Session, obj: StoredObject, cutoff: datetime) -> Outcome:
    try:
        if leased_since(session, obj.key, cutoff):
            return "leased"
        return "referenced" if is_referenced(session, obj.key) else "removed"
    finally:
        session.rollback()


def _remove(session: Session, store: ObjectStore, obj: StoredObject,
            cutoff: datetime) -> Outcome:
    try:
        if hold_for_removal(session, obj.key) >= cutoff:
            return "leased"
        if is_referenced(session, obj.key):
            return "referenced"
        if store.size_of(obj.key) is None:  # another pass removed it meanwhile
            return "gone"
        store.delete(obj.key)
        drop_lease(session, obj.key)
        session.commit()
        return "removed"
    finally:
        session.rollback()


def _purge_and_audit(session: Session, store: ObjectStore, actor: str, cutoff: datetime,
                     removed: list[RemovedBlob]) -> int:
    try:
        begin_write(session)
        purged = purge_leases(session, cutoff)
        record_audit(session, actor=actor, action="gc.run", target=f"store:{store.url}"[:300],
                     detail={"removed": len(removed),
                             "removed_bytes": sum(r.size_bytes for r in removed),
                             "keys": [r.key for r in removed[:AUDITED_KEYS]],
                             "leases_purged": purged})
        session.commit()
        return purged
    finally:
        session.rollback()
