"""Celery task `adapterplane.merge_release(merge_id)`.

Transient faults (storage, database connections: `controlplane.worker.retry`) are
retried with the validation job's backoff settings; a merge that fails on its inputs or
its exactness gate ends in `rejected` and is never retried. The job is idempotent
(`job.py`).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.merges.job import merge_release_now
from controlplane.models import Merge, MergeState
from controlplane.worker.context import worker_context
from controlplane.worker.job_rows import record_error
from controlplane.worker.retry import run_with_retry


@shared_task(name="adapterplane.merge_release", bind=True, acks_late=True,
             reject_on_worker_lost=True)
def merge_release(self: Any, merge_id: int) -> str | None:
    ctx = worker_context(self.app)
    return run_with_retry(
        self, ctx,
        lambda: merge_release_now(merge_id, session_factory=ctx.session_factory,
                                  store=ctx.store, settings=ctx.settings),
        lambda message: record_error(ctx.session_factory, Merge, merge_id,
                                     MergeState.MERGING.value, message))
