"""A worker process forked after its parent built a task context gets its own.

The prefork pool replaces a child killed with SIGKILL by forking the main process, which
by then holds a context of its own (the reaper thread's DB pool). The child must open
its own Postgres connections — sharing the parent's socket corrupts both sessions — and
must not inherit the context lock held by another of the parent's threads at the fork.
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from cp_helpers import make_settings
from sqlalchemy import text

from controlplane.worker import context
from controlplane.worker.celery_app import make_celery
from controlplane.worker.context import dispose_worker_context, worker_context


def _backend_pid(app: object) -> int:
    with worker_context(app).session_factory() as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _child(app: object, out: Connection) -> None:
    try:
        out.send(("ok", _backend_pid(app)))
        dispose_worker_context(app)  # closes what the child opened, nothing of the parent's
    except BaseException as exc:  # reported to the parent, which fails the test
        out.send(("error", repr(exc)))


def test_forked_child_opens_its_own_connections(pg_url: str, tmp_path: Path) -> None:
    app = make_celery(make_settings(pg_url, tmp_path))
    try:
        parent_backend = _backend_pid(app)  # the parent's pool now holds one idle connection
        fork = multiprocessing.get_context("fork")
        receive, send = fork.Pipe(duplex=False)
        holder_ready, release = threading.Event(), threading.Event()

        def hold_lock() -> None:  # another thread of the parent holds the lock at the fork
            with context._lock:
                holder_ready.set()
                release.wait(10)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        holder_ready.wait(10)
        try:
            proc = fork.Process(target=_child, args=(app, send))
            proc.start()
        finally:
            release.set()
            holder.join()
        assert receive.poll(30), "the forked child never answered (deadlocked on the lock)"
        status, value = receive.recv()
        proc.join(30)
        assert status == "ok", value
        assert value != parent_backend, "the child reused the parent's Postgres connection"
        assert proc.exitcode == 0
        # The parent's own connection survived the child's dispose: same backend as before.
        assert _backend_pid(app) == parent_backend
    finally:
        dispose_worker_context(app)
