"""What a worker does at start and stop, wired to Celery's worker signals.

- `worker_init` (the main process, before any job): remove stale scratch roots of dead
  worker processes (`scratch.py`).
- `worker_process_init` (each process that runs jobs; the main one under `--pool solo`):
  remove the stale scratch roots again, then use a scratch root of its own; removed again
  at `worker_process_shutdown`. A prefork child forked to replace one killed with SIGKILL
  thereby removes its dead sibling's root, which no `worker_init` would see while the
  main process lives.
- `worker_shutdown` (main process, after the pool): remove its own root and those of
  children that ended without running their hook.
- `worker_ready`: start the reaper thread (`reaper.py`) unless `job_reap_interval_s`
  is 0; stopped at `worker_shutdown`. It needs no Celery beat, so it runs with every
  broker, the embedded SQLite one included.

The handlers fire only in worker processes; the API importing this module is inert.
"""

from __future__ import annotations

from typing import Any

from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from controlplane.worker.context import worker_context
from controlplane.worker.jobs import JobQueue
from controlplane.worker.reaper import ReaperThread
from controlplane.worker.scratch import (
    remove_own_scratch,
    remove_stale_scratch,
    use_process_scratch,
)

_reapers: list[ReaperThread] = []


@worker_init.connect(dispatch_uid="adapterplane.remove_stale_scratch")
def _on_worker_init(**_: Any) -> None:
    remove_stale_scratch()


@worker_process_init.connect(dispatch_uid="adapterplane.use_process_scratch")
def _on_process_init(**_: Any) -> None:
    remove_stale_scratch()
    use_process_scratch()


@worker_process_shutdown.connect(dispatch_uid="adapterplane.remove_process_scratch")
def _on_process_shutdown(**_: Any) -> None:
    remove_own_scratch()


@worker_ready.connect(dispatch_uid="adapterplane.start_reaper")
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    app = sender.app
    ctx = worker_context(app)
    interval = ctx.settings.job_reap_interval_s
    if interval <= 0:
        return
    queue = JobQueue(app, ctx.settings.celery_queue)
    reaper = ReaperThread(ctx.session_factory, queue, ctx.settings, interval)
    _reapers.append(reaper)
    reaper.start()


@worker_shutdown.connect(dispatch_uid="adapterplane.stop_reaper")
def _on_worker_shutdown(**_: Any) -> None:
    while _reapers:
        _reapers.pop().stop()
    remove_own_scratch()
    remove_stale_scratch()  # pool children that ended without their own shutdown hook
