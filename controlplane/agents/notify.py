"""Wake agents' long-polls when the catalog changes.

On Postgres, one `LISTEN adapterplane_catalog` connection per API process (psycopg
async, autocommit) receives the NOTIFY that `catalog.service.notify_catalog_change`
queues in every publish/retire/rollback transaction (delivered at commit) and wakes
every waiter at once. On SQLite there is no NOTIFY; waiters wake every
`FALLBACK_POLL_S` to re-read the catalog version. Either way, callers re-check the
version after waking, so a missed or spurious notification costs at most one poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy.engine import make_url

from controlplane.catalog.service import CATALOG_CHANNEL

log = logging.getLogger("adapterplane.agents.notify")
FALLBACK_POLL_S = 0.1
LISTEN_RECHECK_S = 1.0
"""With LISTEN, waiters still re-check this often (a dropped connection is harmless)."""


class CatalogWaiter:
    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        self.listen = url.get_backend_name() == "postgresql"
        self._conninfo = url.set(drivername="postgresql").render_as_string(
            hide_password=False) if self.listen else ""
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.listening: asyncio.Event | None = None
        """Set once the LISTEN connection is up (tests wait on it)."""

    async def wait(self, timeout_s: float) -> bool:
        """Sleep until a catalog notification or `timeout_s` (capped); True if notified."""
        if not self.listen:
            await asyncio.sleep(min(timeout_s, FALLBACK_POLL_S))
            return False
        if self._task is None or self._task.done():
            self._changed = asyncio.Event()
            self.listening = asyncio.Event()
            self._task = asyncio.create_task(self._listen())
        event = self._changed
        assert event is not None
        try:
            await asyncio.wait_for(event.wait(), min(timeout_s, LISTEN_RECHECK_S))
            return True
        except TimeoutError:
            return False

    async def _listen(self) -> None:
        import psycopg

        try:
            async with await psycopg.AsyncConnection.connect(self._conninfo,
                                                             autocommit=True) as conn:
                await conn.execute(f"LISTEN {CATALOG_CHANNEL}")
                if self.listening is not None:
                    self.listening.set()
                async for _note in conn.notifies():
                    event, self._changed = self._changed, asyncio.Event()
                    if event is not None:
                        event.set()
        except Exception as exc:  # reconnect on the next wait(); waiters re-poll meanwhile
            log.warning("catalog LISTEN connection ended: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def catalog_waiter(app: Any) -> CatalogWaiter:
    """The app's one waiter (its LISTEN connection starts with the first long-poll): the
    agents' desired-state and the routers' routing-state long-polls share it."""
    waiter: CatalogWaiter | None = getattr(app.state, "catalog_waiter", None)
    if waiter is None:
        waiter = CatalogWaiter(app.state.settings.database_url)
        app.state.catalog_waiter = waiter
    return waiter
