"""The reaper: send again the jobs of rows stuck in a busy state.

A job can be lost without a trace on its row: the send after commit failed, the
embedded SQLite broker dropped the message of a killed worker, the retries of a
transient fault ran out. A row still busy (artifact `pending`/`validating`, collection
`pending`/`fitting`) `job_reap_after_s` after it was created gets its job sent again,
with an audit row `<kind>.requeued` (actor `worker:reaper`); that audit row also holds
the next send back for another `job_reap_after_s`, so N workers reaping at once send
one job per row and deadline, not N. Both jobs are idempotent, so a job sent again
while the first one still runs costs work, never correctness.

`reap_stuck_jobs` is one pass (callable from anywhere with a session factory and a
queue); `ReaperThread` runs it in a worker at start and every `job_reap_interval_s`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.audit.service import record_audit
from controlplane.config import Settings
from controlplane.db import begin_write, session_scope
from controlplane.models import (
    Artifact,
    ArtifactState,
    AuditEntry,
    Collection,
    CollectionState,
    Merge,
    MergeState,
    utcnow,
)
from controlplane.worker.jobs import JobQueue

log = logging.getLogger(__name__)

REAPER_ACTOR = "worker:reaper"
BATCH = 500


@dataclass(frozen=True)
class JobKind:
    noun: str
    model: type[Any]
    busy_states: tuple[str, ...]
    task_name: str


JOB_KINDS = (
    JobKind("artifact", Artifact, (ArtifactState.PENDING.value, ArtifactState.VALIDATING.value),
            "adapterplane.validate_artifact"),
    JobKind("collection", Collection,
            (CollectionState.PENDING.value, CollectionState.FITTING.value),
            "adapterplane.fit_collection"),
    JobKind("merge", Merge, (MergeState.PENDING.value, MergeState.MERGING.value),
            "adapterplane.merge_release"),
)


def reap_stuck_jobs(factory: sessionmaker[Session], jobs: JobQueue, settings: Settings,
                    now: datetime | None = None) -> dict[str, list[int]]:
    """One pass; returns `{noun: [row ids whose job was sent again]}` (at most BATCH
    rows of each kind per pass, oldest first)."""
    deadline = (now or utcnow()) - timedelta(seconds=settings.job_reap_after_s)
    return {kind.noun: _reap(factory, jobs, kind, deadline) for kind in JOB_KINDS}


def _reap(factory: sessionmaker[Session], jobs: JobQueue, kind: JobKind,
          deadline: datetime) -> list[int]:
    model = kind.model
    with session_scope(factory) as session:
        begin_write(session)
        rows = list(session.scalars(
            select(model).where(model.state.in_(kind.busy_states), model.created_at < deadline)
            .order_by(model.id).limit(BATCH).with_for_update(of=model, skip_locked=True))
            .unique())
        recent = set(session.scalars(select(AuditEntry.target).where(
            AuditEntry.action == f"{kind.noun}.requeued", AuditEntry.created_at >= deadline,
            AuditEntry.target.in_([f"{kind.noun}:{row.id}" for row in rows]))))
        sent: list[int] = []
        for row in rows:
            target = f"{kind.noun}:{row.id}"
            if target in recent:
                continue
            record_audit(session, actor=REAPER_ACTOR, action=f"{kind.noun}.requeued",
                         namespace=row.namespace.name, target=target,
                         detail={"state": row.state, "last_error": row.last_error})
            jobs.enqueue(session, kind.task_name, row.id)
            sent.append(row.id)
        session.commit()  # the jobs are sent now (JobQueue: after commit)
    if sent:
        log.warning("reaper sent %d %s job(s) again: %s", len(sent), kind.noun, sent)
    return sent


class ReaperThread(threading.Thread):
    """Runs `reap_stuck_jobs` now and every `interval_s` until `stop()`; a failed pass
    (database down) is logged and tried again at the next tick."""

    def __init__(self, factory: sessionmaker[Session], jobs: JobQueue, settings: Settings,
                 interval_s: float) -> None:
        super().__init__(name="adapterplane-reaper", daemon=True)
        self.factory, self.jobs, self.settings = factory, jobs, settings
        self.interval_s = interval_s
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                reap_stuck_jobs(self.factory, self.jobs, self.settings)
            except Exception:  # keep reaping after a transient fault
                log.exception("reaper pass failed")
            self._stopped.wait(self.interval_s)

    def stop(self) -> None:
        self._stopped.set()
