"""FastAPI dependencies for app-wide resources, as `Annotated` aliases.

Resources live on `app.state` (set by `create_app`): settings, session factory,
object store, job queue. Request handlers run in the threadpool with one session
each; services commit explicitly, and the session is rolled back and closed after
the response no matter what. Hot read paths (auth, resolve) use `run_read` on the
app's read engine instead (`app.state.read_engine`, :func:`make_read_engine`): one
pooled autocommit connection, no ORM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError
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


T = TypeVar("T")
AUTOCOMMIT_ENGINE = "adapterplane_autocommit"
"""Execution option marking an engine whose connections are always autocommit."""


def make_read_engine(engine: Engine, *, pool_size: int) -> Engine:
    """The pool of the hot reads beside `engine`'s. Postgres: connections that are
    autocommit for life, so a checkout costs no round trip (no isolation switch, no
    reset on return, no pre-ping: a connection the server dropped fails its statement
    and :func:`run_read` tries once more on a fresh one). SQLite: `engine` itself."""
    if engine.dialect.name == "sqlite":
        return engine
    reads = create_engine(engine.url, pool_size=pool_size, max_overflow=pool_size,
                          isolation_level="AUTOCOMMIT", pool_pre_ping=False,
                          pool_reset_on_return=None)
    return reads.execution_options(**{AUTOCOMMIT_ENGINE: True})


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """Autocommit on Postgres; on SQLite a plain connection (its `begin` hook owns
    transaction control, and the read transaction ends when the connection closes)."""
    with engine.connect() as conn:
        if conn.dialect.name != "sqlite" and not conn.get_execution_options().get(
                AUTOCOMMIT_ENGINE):
            conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def run_read(engine: Engine, read: Callable[[Connection], T]) -> T:
    """`read(conn)` on a read connection, once more on a fresh connection when the first
    one turned out dead (the server restarted or dropped it): reads are idempotent."""
    try:
        with read_connection(engine) as conn:
            return read(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    with read_connection(engine) as conn:
        return read(conn)


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
