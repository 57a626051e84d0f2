"""`adapterplane router`: the fleet's one OpenAI-compatible URL.

The inference routes (`POST /v1/completions`, `/v1/chat/completions`) are the request
path of agent/router/relay.py: admitted, resolved to the alias's current generation,
routed by agent/router/routing.py and relayed to one agent. Everything else is this
FastAPI app: `/healthz`, `/readyz` (ready once the first routing state is applied),
`/metrics` and `GET /v1/models` (the bare base models and every alias the caller may
read). The agents' auth gate is in front of both: a POST with a missing, unknown or
revoked token is refused before its body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp

from agent.auth_gate import AuthGate
from agent.catalog import Unauthenticated
from agent.error_handlers import install_error_handlers
from agent.openai_errors import ERROR_RESPONSES
from agent.router.config import RouterSettings
from agent.router.context import RouterContext, make_context
from agent.router.relay import RETRY_AFTER_S, InferenceRelay, bearer


def create_router_app(ctx: RouterContext) -> ASGIApp:
    """The router's ASGI app: the auth gate, the inference relay, then the FastAPI app."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ctx.open_agent_session()
        poll = asyncio.ensure_future(ctx.table.run(ctx.control_plane, ctx.settings.refresh_s))
        try:
            yield
        finally:
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll
            await ctx.control_plane.aclose()
            if ctx.agents is not None:
                await ctx.agents.close()
            ctx.client.close()

    app = FastAPI(title="Adapterplane router", version="1", responses=ERROR_RESPONSES,
                  lifespan=lifespan)
    install_error_handlers(app, RETRY_AFTER_S)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = ctx.table.ready
        return JSONResponse({"status": "ready" if ready else "not_ready"},
                            status_code=200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        _observe_table(ctx)
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        token = bearer(request.scope)
        if await ctx.can_read(token, "*") == 401:
            raise Unauthenticated("unknown or revoked token")
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "owned_by": "adapterplane"}
            for name in sorted(ctx.table.base_names)]
        allowed: dict[str, bool] = {}
        for (namespace, name), alias in sorted(ctx.table.aliases.items()):
            if alias.digest is None:
                continue
            if namespace not in allowed:
                allowed[namespace] = await ctx.can_read(token, namespace) == 200
            if allowed[namespace]:
                data.append({"id": f"{namespace}/{name}", "object": "model",
                             "owned_by": namespace,
                             "adapterplane": {"namespace": namespace, "alias": name,
                                              "generation": alias.current_generation,
                                              "artifact_digest": alias.digest}})
        return {"object": "list", "data": data}

    return AuthGate(InferenceRelay(app, ctx), status=lambda token: ctx.can_read(token, "*"),
                    retry_after_s=RETRY_AFTER_S)


def _observe_table(ctx: RouterContext) -> None:
    table = ctx.table
    if table.refreshed_at is not None:
        ctx.metrics.table_age.set(time.monotonic() - table.refreshed_at)
    counts = {"routable": 0, "draining": 0, "stale": 0}
    for view in table.views:
        state = ("stale" if view.heartbeat_age_s > table.lease_s
                 else "draining" if view.drain else "routable")
        counts[state] += 1
    for state, n in counts.items():
        ctx.metrics.agents.labels(state).set(n)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the router with settings from the environment (`ADAPTERPLANE_ROUTER_*`) and
    `--key=value` arguments."""
    import uvicorn

    from agent.config import command_line

    settings = command_line(RouterSettings, argv or (), "router")
    if settings is None:
        return 0
    app = create_router_app(make_context(settings))
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                access_log=False, timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
