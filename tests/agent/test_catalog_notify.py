"""The long-poll waiter wakes on a real Postgres NOTIFY of the catalog channel."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from controlplane.agents.notify import CatalogWaiter
from controlplane.catalog.service import CATALOG_CHANNEL
from controlplane.db import make_engine


def test_waiter_wakes_on_catalog_notify(postgres_url: str) -> None:
    waiter = CatalogWaiter(postgres_url)
    assert waiter.listen
    engine = make_engine(postgres_url, pool_size=1)

    async def scenario() -> bool:
        await waiter.wait(0.3)  # connects and listens (others may NOTIFY on a shared DB)
        assert waiter.listening is not None
        await waiter.listening.wait()
        task = asyncio.create_task(waiter.wait(30))
        await asyncio.sleep(0)
        with engine.begin() as conn:
            conn.execute(select(func.pg_notify(CATALOG_CHANNEL, '{"alias": "x"}')))
        woke = await task
        await waiter.close()
        return woke

    try:
        woke = asyncio.run(scenario())
    finally:
        engine.dispose()
    assert woke  # within one LISTEN_RECHECK_S: only a notification returns True


def test_sqlite_waiter_polls() -> None:
    waiter = CatalogWaiter("sqlite:///unused.db")
    assert not waiter.listen
    assert asyncio.run(waiter.wait(5)) is False
