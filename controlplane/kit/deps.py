"""FastAPI dependencies for app-wide resources, as `Annotated` aliases.

Resources live on `app.state` (set by `create_app`): settings, session factory,
object store, job queue. Request handlers run in the threadpool with one session
each; services commit explicitly, and the session is rolled back and closed after
the response no matter what. Hot read paths (auth, resolve) use `read_connection`
instead: one pooled connection in autocommit mode, no ORM.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.storage import ObjectStore
from controlplane.worker.jobs import JobQueue


def get_session(request: Request) -> Iterator[Session]:
    session: Session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """Autocommit on Postgres; on SQLite a plain connection (its `begin` hook owns
    transaction control, and the read transaction ends when the connection closes)."""
    with engine.connect() as conn:
        if conn.dialect.name != "sqlite":
            conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


def get_jobs(request: Request) -> JobQueue:
    jobs: JobQueue = request.app.state.jobs
    return jobs


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
JobsDep = Annotated[JobQueue, Depends(get_jobs)]
