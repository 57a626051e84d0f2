"""Celery task `adapterplane.validate_artifact(artifact_id)`.

Transient storage errors are retried by Celery with exponential backoff
(`validation_retry_backoff_s * 2**retries`, capped, at most `validation_max_retries`);
validation failures are never retried: they end in `rejected`.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.artifacts.validation import validate_artifact_now
from controlplane.storage import TransientStorageError
from controlplane.worker.context import worker_context
from controlplane.worker.retry import retry_transient


@shared_task(name="adapterplane.validate_artifact", bind=True, acks_late=True,
             reject_on_worker_lost=True)
def validate_artifact(self: Any, artifact_id: int) -> str | None:
    ctx = worker_context(self.app)
    try:
        return validate_artifact_now(artifact_id, session_factory=ctx.session_factory,
                                     store=ctx.store, settings=ctx.settings)
    except TransientStorageError as exc:
        raise retry_transient(self, ctx, exc) from exc
