"""What every job over a registry row shares (artifact validation, collection fits).

- `locked(session, Model, id)`: the row under a write lock (FOR UPDATE on Postgres, the
  write transaction on SQLite), or None.
- `record_error(factory, Model, id, busy_state, message)`: keep the last transient fault
  on a row still in its busy state (the job is retried; the row says why it waits).
- `fetch_blobs(...)`: digest-checked copies of stored files; a mismatch or a missing
  object is a typed `Fault` (the input is bad: reject), any other storage error is
  recorded on the row and raised (transient: the task retries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.audit.service import record_audit
from controlplane.db import begin_write, session_scope
from controlplane.storage import ChecksumMismatch, ObjectNotFound, ObjectStore, StorageError

Row = TypeVar("Row")


@dataclass(frozen=True)
class Refused:
    """A job's typed refusal of its row: the rejection code, message and detail (and the
    metrics a release gate measured before refusing, kept on the row)."""

    code: str
    message: str
    detail: dict[str, Any]
    metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class Fault:
    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


def locked(session: Session, model: type[Row], row_id: int) -> Row | None:
    begin_write(session)
    stmt = select(model).where(model.id == row_id).with_for_update(of=model)  # type: ignore[attr-defined]
    row: Row | None = session.scalars(stmt).unique().one_or_none()
    return row


def record_error(factory: sessionmaker[Session], model: type[Any], row_id: int,
                 busy_state: str, message: str) -> None:
    with session_scope(factory) as session:
        row = locked(session, model, row_id)
        if row is not None and row.state == busy_state:
            row.last_error = message[:2000]
            session.commit()


def fetch_blobs(store: ObjectStore, files: Mapping[str, Any], dest: Path, *, where: str,
                detail: Mapping[str, Any], on_error: Any) -> Fault | None:
    """Copy every `{name: {"key", "sha256"}}` into `dest`; `where` prefixes messages,
    `detail` is merged into a fault's detail, `on_error(message)` runs before a transient
    storage error is re-raised."""
    for name, ref in sorted(files.items()):
        try:
            store.get_blob(ref["key"], dest / name, expected_sha256=ref["sha256"])
        except ChecksumMismatch as exc:
            return Fault("checksum_mismatch", f"{where}{name}: stored bytes do not match "
                         "their digest", {**detail, "file": name, "expected": exc.expected,
                                          "actual": exc.actual})
        except ObjectNotFound:
            return Fault("object_missing", f"{where}{name}: object is missing from storage",
                         {**detail, "file": name, "key": ref["key"]})
        except StorageError as exc:
            on_error(f"{type(exc).__name__}: {exc}")
            raise
    return None


def record_refusal(session: Session, row: Any, refused: Refused, rejected: Any, *,
                   actor: str, action: str, namespace: str, target: str) -> None:
    """Move a job's row to `rejected` with the refusal's code, message, detail and
    metrics, and its audit entry (`action`), in the caller's transaction."""
    row.transition(rejected)
    row.rejection_code = refused.code
    row.rejection_message = refused.message
    row.rejection_detail = refused.detail
    row.metrics = refused.metrics
    record_audit(session, actor=actor, action=action, namespace=namespace, target=target,
                 detail={"code": refused.code, "message": refused.message})
