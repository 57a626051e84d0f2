"""Backoff for jobs that retry transient faults (validation, collection fits).

Transient: a `TransientStorageError`, or a database fault that says nothing about the
data (connection lost or refused, server shutting down, pool exhausted: SQLAlchemy's
`OperationalError`, `InterfaceError`, pool `TimeoutError`, or any DBAPI error that
invalidated its connection). An `IntegrityError`, `DataError` or `ProgrammingError` is a
bug or bad data; retrying cannot help, so it fails the attempt at once.

After `validation_max_retries` the task fails with the last fault and its row stays in
its busy state (`validating`/`fitting`) with `last_error` set. It is not rejected: the
fault is the infrastructure's, not the artifact's, and a rejected upload cannot be
pushed again (a re-push returns the same row). The reaper (`reaper.py`) sends the job
again once the row is older than `job_reap_after_s`, and a re-push sends it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc

from controlplane.storage import TransientStorageError
from controlplane.worker.context import WorkerContext

log = logging.getLogger(__name__)

T = TypeVar("T")

_PERMANENT_DB_ERRORS = (sa_exc.IntegrityError, sa_exc.DataError, sa_exc.ProgrammingError)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientStorageError):
        return True
    if isinstance(exc, _PERMANENT_DB_ERRORS):
        return False
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


def retry_transient(task: Any, ctx: WorkerContext, exc: Exception) -> Exception:
    """`task.retry(...)` after `validation_retry_backoff_s * 2**retries` (capped), at most
    `validation_max_retries` times; raise what it returns (the fault itself once retries
    are exhausted)."""
    settings = ctx.settings
    countdown = min(settings.validation_retry_backoff_max_s,
                    settings.validation_retry_backoff_s * 2 ** task.request.retries)
    retry: Exception = task.retry(exc=exc, countdown=countdown,
                                  max_retries=settings.validation_max_retries)
    return retry


def run_with_retry(task: Any, ctx: WorkerContext, body: Callable[[], T],
                   record: Callable[[str], None]) -> T:
    """Run one attempt of a job; a transient fault is retried with backoff. A database
    fault is first noted on the row with `record(message)` when the database lets us
    (storage faults are noted by the job body itself)."""
    try:
        return body()
    except Exception as exc:
        if not is_transient(exc):
            raise
        if not isinstance(exc, TransientStorageError):
            try:
                record(f"{type(exc).__name__}: {exc}")
            except sa_exc.SQLAlchemyError as note_exc:  # still down: the log says it
                log.warning("could not record %s on the job's row: %s",
                            type(exc).__name__, note_exc)
        raise retry_transient(task, ctx, exc) from exc
