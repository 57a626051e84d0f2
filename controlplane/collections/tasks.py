"""Celery task `adapterplane.fit_collection(collection_id)`.

Transient storage errors are retried with the validation job's backoff settings; a fit
that fails on its inputs ends in `rejected` and is never retried.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.collections.fitting import fit_collection_now
from controlplane.storage import TransientStorageError
from controlplane.worker.context import worker_context
from controlplane.worker.retry import retry_transient


@shared_task(name="adapterplane.fit_collection", bind=True, acks_late=True,
             reject_on_worker_lost=True)
def fit_collection(self: Any, collection_id: int) -> str | None:
    ctx = worker_context(self.app)
    try:
        return fit_collection_now(collection_id, session_factory=ctx.session_factory,
                                  store=ctx.store)
    except TransientStorageError as exc:
        raise retry_transient(self, ctx, exc) from exc
