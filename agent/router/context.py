"""What one router process holds: settings, clients, the routing replica, local views."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
import httpx

from agent.router.config import RouterSettings
from agent.router.metrics import RouterMetrics
from agent.router.routing import LocalView
from agent.router.table import RoutingTable
from agent.sync import ControlPlaneClient

FORCED_REFRESH_GAP_S = 0.1
"""An unknown alias refreshes the replica at once (a publish may be newer than the last
poll), at most this often."""


@dataclass
class RouterContext:
    settings: RouterSettings
    client: ControlPlaneClient
    """Client-token checks (cached, stale-while-revalidate)."""
    control_plane: httpx.AsyncClient
    """The routing-state long-poll (router token)."""
    agents: aiohttp.ClientSession | None = None
    """Connections to agents (kept alive, pooled; aiohttp: a fraction of httpx's CPU per
    request, which is most of what a router spends). Opened in the app's event loop."""
    table: RoutingTable = field(default_factory=RoutingTable)
    local: LocalView = field(default_factory=LocalView)
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    _forced_at: float = 0.0
    _forced: asyncio.Task[None] | None = None

    async def refresh_now(self) -> None:
        """Refresh the replica at once (shared by concurrent callers, rate-limited)."""
        if self._forced is None or self._forced.done():
            if time.monotonic() - self._forced_at < FORCED_REFRESH_GAP_S:
                return
            self._forced_at = time.monotonic()
            self._forced = asyncio.ensure_future(self.table.refresh(self.control_plane, 0))
        with contextlib.suppress(httpx.HTTPError, ValueError):
            await asyncio.shield(self._forced)

    async def can_read(self, token: str, namespace: str) -> int:
        """HTTP status of the token's read check on `namespace` (cached per token)."""
        cached = self.client.cached_read(token, namespace)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.client.can_read, token, namespace)

    def open_agent_session(self) -> None:
        """Open the pooled agent connections (in the serving event loop)."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.settings.connect_timeout_s,
                                        sock_read=self.settings.request_timeout_s)
        self.agents = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60))


def make_context(settings: RouterSettings) -> RouterContext:
    token = settings.token.get_secret_value()
    return RouterContext(
        settings=settings,
        client=ControlPlaneClient(settings.control_plane_url, token,
                                  auth_cache_s=settings.auth_cache_s,
                                  auth_stale_s=settings.auth_stale_s),
        control_plane=httpx.AsyncClient(base_url=settings.control_plane_url.rstrip("/"),
                                        headers={"Authorization": f"Bearer {token}"}))
