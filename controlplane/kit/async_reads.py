"""One-statement reads on the event loop (psycopg's async pool), for the per-request hot
path on Postgres: resolve.

Run through the sync engine, a resolve costs a threadpool hop and SQLAlchemy's execution
machinery around one indexed SELECT; on two cores under load that CPU is the latency.
Here the statement (still built with SQLAlchemy Core, the one definition) is compiled
once for psycopg and executed on a pooled autocommit connection from the event loop:
no thread, no per-checkout round trip. A pooled connection the server dropped fails its
statement; the pool's idle connections are then checked (dead ones discarded) and the
read is tried once more; a database that cannot be
reached is `DatabaseUnavailable` (503), as everywhere else.

The pool is opened by the first read, in the event loop that runs the app, and closed
by the app's lifespan.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import URL, Select
from sqlalchemy.dialects import postgresql

from controlplane.errors import DatabaseUnavailable

_DIALECT = postgresql.psycopg.dialect()


class CompiledRead:
    """A Core SELECT compiled once for psycopg (named parameters, defaults merged)."""

    def __init__(self, statement: Select[Any]) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        self.sql = str(compiled)
        self.defaults: dict[str, Any] = dict(compiled.params)


async def _utc(conn: psycopg.AsyncConnection[Any]) -> None:
    """Timestamps in UTC, as the sync engine returns them (the URL's own connection
    options, e.g. a `search_path`, stay as they are)."""
    await conn.execute("SET TIME ZONE 'UTC'")


class AsyncReads:
    def __init__(self, url: URL, max_size: int) -> None:
        self.conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.max_size = max_size
        self._pool: AsyncConnectionPool[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _open(self) -> AsyncConnectionPool[Any]:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.conninfo, min_size=1, max_size=self.max_size, open=False, timeout=10,
                kwargs={"autocommit": True, "row_factory": namedtuple_row},
                configure=_utc)
            await pool.open()
            self._pool, self._loop = pool, loop
        return self._pool

    async def fetch_one(self, read: CompiledRead, params: dict[str, Any]) -> Any:
        """The statement's first row (None when it has none)."""
        args = {**read.defaults, **params}
        try:
            pool = await self._open()
            async with pool.connection() as conn:
                try:
                    return await (await conn.execute(read.sql, args)).fetchone()
                except psycopg.OperationalError:
                    if not conn.broken:
                        raise
            # the server dropped it (a restart drops them all): test the idle ones, which
            # discards the dead, and try once more on a live or fresh connection
            await pool.check()
            async with pool.connection() as conn:
                return await (await conn.execute(read.sql, args)).fetchone()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise DatabaseUnavailable("the database is unavailable; retry later",
                                      detail={"reason": type(exc).__name__}) from exc

    def pool_size(self) -> int:
        """Connections the pool holds now (0 before the first read)."""
        return 0 if self._pool is None else int(self._pool.get_stats()["pool_size"])

    async def close(self) -> None:
        if self._pool is not None and self._loop is asyncio.get_running_loop():
            await self._pool.close()
        self._pool = self._loop = None
