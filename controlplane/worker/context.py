"""Per-process resources for tasks: settings, DB session factory, object store.

Built once per worker process from the settings the Celery app was made with
(`app.adapterplane_settings`, set by `make_celery`), or from the environment.
"""

from __future__ import annotations

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


_lock = threading.Lock()
_ATTR = "_adapterplane_worker_context"


def worker_context(app: Any) -> WorkerContext:
    """The context cached on the Celery app object (one engine per app and process)."""
    with _lock:
        ctx: WorkerContext | None = getattr(app, _ATTR, None)
        if ctx is None:
            settings = getattr(app, "adapterplane_settings", None) or Settings()
            engine = make_engine(settings.database_url, pool_size=2)
            ctx = WorkerContext(settings, make_session_factory(engine),
                                store_from_settings(settings))
            setattr(app, _ATTR, ctx)
        return ctx


def dispose_worker_context(app: Any) -> None:
    """Close the app's pooled DB connections (API shutdown, tests)."""
    with _lock:
        ctx: WorkerContext | None = getattr(app, _ATTR, None)
        if ctx is not None:
            bind = ctx.session_factory.kw.get("bind")
            if bind is not None:
                bind.dispose()
            delattr(app, _ATTR)
