"""Per-process resources for tasks: settings, DB session factory, object store.

Built once per worker process from the settings the Celery app was made with
(`app.adapterplane_settings`, set by `make_celery`), or from the environment.

The context belongs to the process that built it. The prefork pool forks a child to
replace one that died after the main process has built its own context (the reaper
thread's): such a child must not reuse the parent's pooled connections or S3 client —
their sockets are shared with the parent, and two processes on one Postgres connection
corrupt its protocol or wait forever. So a context carries its builder's pid; a process
that finds another pid's context drops the inherited pool without closing the parent's
sockets (`dispose(close=False)`) and builds its own. The lock is recreated in every
forked child, since another thread of the parent may have held it at the fork.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import Settings
from controlplane.db import make_engine, make_session_factory
from controlplane.storage import ObjectStore, store_from_settings


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    store: ObjectStore
    pid: int


_lock = threading.Lock()
_ATTR = "_adapterplane_worker_context"


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def _bind(ctx: WorkerContext) -> Any:
    return ctx.session_factory.kw.get("bind")


def worker_context(app: Any) -> WorkerContext:
    """The context cached on the Celery app object (one engine per app and process)."""
    with _lock:
        ctx: WorkerContext | None = getattr(app, _ATTR, None)
        if ctx is not None and ctx.pid != os.getpid():
            bind = _bind(ctx)
            if bind is not None:
                bind.dispose(close=False)  # the parent's sockets stay the parent's
            ctx = None
        if ctx is None:
            settings = getattr(app, "adapterplane_settings", None) or Settings()
            engine = make_engine(settings.database_url, pool_size=2)
            ctx = WorkerContext(settings, make_session_factory(engine),
                                store_from_settings(settings), os.getpid())
            setattr(app, _ATTR, ctx)
        return ctx


def dispose_worker_context(app: Any) -> None:
    """Close the app's pooled DB connections (API shutdown, tests)."""
    with _lock:
        ctx: WorkerContext | None = getattr(app, _ATTR, None)
        if ctx is not None:
            bind = _bind(ctx)
            if bind is not None:
                bind.dispose(close=ctx.pid == os.getpid())
            delattr(app, _ATTR)
