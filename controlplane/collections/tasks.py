"""Celery task `adapterplane.fit_collection(collection_id)`.

Transient faults (storage, database connections: `controlplane.worker.retry`) are
retried with the validation job's backoff settings; a fit that fails on its inputs ends
in `rejected` and is never retried. Retries exhausted leave the collection `fitting` for
the reaper (`controlplane.worker.reaper`); the job is idempotent (`fitting.py`).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.collections.fitting import fit_collection_now
from controlplane.models import Collection, CollectionState
from controlplane.worker.context import worker_context
from controlplane.worker.job_rows import record_error
from controlplane.worker.retry import run_with_retry


@shared_task(name="adapterplane.fit_collection", bind=True, acks_late=True,
             reject_on_worker_lost=True)
def fit_collection(self: Any, collection_id: int) -> str | None:
    ctx = worker_context(self.app)
    return run_with_retry(
        self, ctx,
        lambda: fit_collection_now(collection_id, session_factory=ctx.session_factory,
                                   store=ctx.store),
        lambda message: record_error(ctx.session_factory, Collection, collection_id,
                                     CollectionState.FITTING.value, message))
