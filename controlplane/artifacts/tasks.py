"""Celery task `adapterplane.validate_artifact(artifact_id)`.

Transient faults (storage errors, lost or refused database connections:
`controlplane.worker.retry`) are retried by Celery with exponential backoff
(`validation_retry_backoff_s * 2**retries`, capped, at most `validation_max_retries`);
validation failures are never retried: they end in `rejected`. Retries exhausted leave
the artifact `validating` for the reaper (`controlplane.worker.reaper`). The job is
idempotent (`validation.py`), so a redelivered or re-sent message is harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.artifacts.validation import record_validation_error, validate_artifact_now
from controlplane.worker.context import worker_context
from controlplane.worker.retry import run_with_retry


@shared_task(name="adapterplane.validate_artifact", bind=True, acks_late=True,
             reject_on_worker_lost=True)
def validate_artifact(self: Any, artifact_id: int) -> str | None:
    ctx = worker_context(self.app)
    return run_with_retry(
        self, ctx,
        lambda: validate_artifact_now(artifact_id, session_factory=ctx.session_factory,
                                      store=ctx.store, settings=ctx.settings),
        lambda message: record_validation_error(ctx.session_factory, artifact_id, message))
