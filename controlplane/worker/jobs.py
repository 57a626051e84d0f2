"""Enqueue jobs only after the database transaction that produced them commits.

`JobQueue.enqueue(session, task_name, *args)` parks the job in `session.info`; an
`after_commit` hook sends every parked job, and rollbacks drop them. A job therefore
never sees a row its transaction did not commit, and a rolled-back request sends
nothing.

Jobs are sent with `ignore_result`: their outcome is their row, never a Celery result.
So a send touches only the broker, never the result backend: with a Redis backend,
waiting on a result subscribes to it on every send, which blocks a request for the
backend's whole reconnect policy (~20 s) while Redis is down and then leaves the
sender's result consumer broken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

_PENDING = "adapterplane_pending_jobs"


@dataclass(frozen=True)
class Job:
    task_name: str
    args: tuple[Any, ...]


class JobQueue:
    """Sends jobs through a Celery app to one queue."""

    def __init__(self, celery: Any, queue: str) -> None:
        self.celery = celery
        self.queue = queue

    def enqueue(self, session: Session, task_name: str, *args: Any) -> None:
        session.info.setdefault(_PENDING, []).append((self, Job(task_name, args)))

    def send_now(self, job: Job) -> None:
        task = self.celery.tasks.get(job.task_name)
        if task is not None:
            task.apply_async(args=list(job.args), queue=self.queue, ignore_result=True)
        else:
            self.celery.send_task(job.task_name, args=list(job.args), queue=self.queue,
                                  ignore_result=True)


@event.listens_for(Session, "after_commit")
def _send_after_commit(session: Session) -> None:
    pending = session.info.pop(_PENDING, [])
    for queue, job in pending:
        try:
            queue.send_now(job)
        except Exception:  # the commit stands; a lost job is recovered by a re-push
            log.exception("could not send job %s%r", job.task_name, job.args)


@event.listens_for(Session, "after_soft_rollback")
def _drop_after_rollback(session: Session, previous_transaction: Any) -> None:
    if getattr(previous_transaction, "nested", False):
        return  # a savepoint rolled back; the outer transaction may still commit
    session.info.pop(_PENDING, None)
