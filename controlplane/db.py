"""Engine and session factory.

SQLite (embedded default): WAL journal, foreign keys on, a busy timeout, and
`begin_write(session)` to open write transactions with `BEGIN IMMEDIATE` so two
writers never deadlock on a read-then-write upgrade. Postgres: psycopg 3 with a
connection pool; `begin_write` is a no-op there (row locks do the work).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_IMMEDIATE = "adapterplane_sqlite_immediate"


def normalize_database_url(url: str | URL) -> URL:
    """`postgresql://` and `postgres://` mean psycopg 3; SQLite parent dirs are created."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database or "").expanduser().parent.mkdir(parents=True, exist_ok=True)
    return parsed


def is_sqlite(engine_or_session: Engine | Session) -> bool:
    bind = engine_or_session.get_bind() if isinstance(engine_or_session, Session) else (
        engine_or_session
    )
    return bind.dialect.name == "sqlite"


def make_engine(url: str | URL, *, pool_size: int = 20, echo: bool = False) -> Engine:
    parsed = normalize_database_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            parsed, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}
        )
        _install_sqlite_hooks(engine)
        return engine
    return create_engine(
        parsed, echo=echo, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from pysqlite so the "begin" hook decides.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(SQLITE_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


def begin_write(session: Session) -> None:
    """Start the session's transaction as a write transaction (call before any query).

    On SQLite this takes the database write lock up front (`BEGIN IMMEDIATE`), so a
    read-compare-write sequence cannot be overtaken by another writer; elsewhere it
    only begins the transaction.
    """
    session.connection(execution_options={SQLITE_IMMEDIATE: True})


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that is rolled back unless the body committed, and always closed."""
    session = factory()
    try:
        yield session
    finally:
        session.rollback()
        session.close()
