"""Celery task `adapterplane.collect_garbage`: the pass Celery beat sends every
`gc_interval_s` (`controlplane.worker.celery_app`, `adapterplane worker --beat`).

Not retried: a failed pass (database or storage down) is logged by Celery and the next
tick runs a full pass anyway. Two passes at once are safe (each removal holds its key's
lease row), so a second beat costs work, never correctness.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from controlplane.db import session_scope
from controlplane.retention.collector import collect_garbage
from controlplane.worker.context import worker_context

GC_ACTOR = "worker:gc"


@shared_task(name="adapterplane.collect_garbage", bind=True, ignore_result=True)
def collect_garbage_task(self: Any) -> dict[str, Any]:
    ctx = worker_context(self.app)
    with session_scope(ctx.session_factory) as session:
        report = collect_garbage(session, ctx.store, ctx.settings, dry_run=False,
                                 actor=GC_ACTOR)
    return {"removed": len(report.removed), "removed_bytes": report.removed_bytes}
