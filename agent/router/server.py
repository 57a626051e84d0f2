"""`adapterplane router`: the fleet's one OpenAI-compatible URL (FastAPI).

`POST /v1/completions` and `/v1/chat/completions` (SSE included) are admitted here and
forwarded to one agent:

1. The caller is authenticated before the body is read (the agents' auth gate, same
   tokens and namespace scopes), then authorized for the alias's namespace (both cached
   per token by the control-plane client).
2. `namespace/alias` is resolved on the router's replica of the catalog
   (agent/router/table.py) to its current generation, and forwarded as
   `namespace/alias@generation`, so the agent serves exactly the generation the request
   was admitted under (404 unknown, 410 retired, as the agents answer). A pinned
   `@generation` is forwarded as given; the bare base model's name routes to any agent
   serving that base.
3. :func:`agent.router.routing.route` orders the agents; the request goes to the first.
   A connection failure, a 5xx or a 429 before the first byte of the answer moves it to
   the next (up to `max_attempts`): nothing reached the client, so nothing is
   duplicated. A stream that breaks after its first byte ends with an error event
   (`{"error": {"code": "UPSTREAM_INTERRUPTED"}}`), never with another agent's tokens.
   Events are relayed whole, so a break never leaves half an event.

The client's own bearer token is forwarded: agents check it again (cached), so a router
cannot widen anyone's access. Answers carry `X-Adapterplane-Agent` (the agent's name).
`GET /v1/models` lists the bare base models and every alias the caller may read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent.auth_gate import AuthGate, control_plane_unavailable
from agent.catalog import (
    AliasRetired,
    BadModelName,
    Forbidden,
    ModelRef,
    ServingError,
    Unauthenticated,
    UnknownAlias,
)
from agent.openai_errors import ERROR_RESPONSES, error_body, error_response
from agent.router.config import RouterSettings
from agent.router.metrics import RouterMetrics
from agent.router.routing import AgentView, LocalView, Target, feasible, route
from agent.router.table import RoutingTable
from agent.sync import ControlPlaneClient, ControlPlaneError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.25
FORCED_REFRESH_GAP_S = 0.1
"""An unknown alias refreshes the replica at once (a publish may be newer than the last
poll), at most this often."""
PASSED_HEADERS = ("content-type", "retry-after", "cache-control")
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
"""A connection to an agent failed: refused, reset, dropped mid-answer, or timed out."""


class NoAgent(ServingError):
    """No routable agent serves this base/adapter (none registered, all draining,
    stale or failing)."""

    status, code = 503, "NO_AGENT_AVAILABLE"


class UpstreamFailed(ServingError):
    """Every agent tried failed before answering."""

    status, code = 502, "UPSTREAM_UNAVAILABLE"


class BodyTooLarge(ServingError):
    status, code = 413, "REQUEST_TOO_LARGE"


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


def make_context(settings: RouterSettings) -> RouterContext:
    token = settings.token.get_secret_value()
    return RouterContext(
        settings=settings,
        client=ControlPlaneClient(settings.control_plane_url, token,
                                  auth_cache_s=settings.auth_cache_s,
                                  auth_stale_s=settings.auth_stale_s),
        control_plane=httpx.AsyncClient(base_url=settings.control_plane_url.rstrip("/"),
                                        headers={"Authorization": f"Bearer {token}"}))


def _agent_session(settings: RouterSettings) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s,
                                    sock_read=settings.request_timeout_s)
    return aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                 connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60))


def create_router_app(ctx: RouterContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ctx.agents = _agent_session(ctx.settings)
        poll = asyncio.ensure_future(ctx.table.run(ctx.control_plane, ctx.settings.refresh_s))
        try:
            yield
        finally:
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll
            await ctx.control_plane.aclose()
            await ctx.agents.close()
            ctx.client.close()

    app = FastAPI(title="Adapterplane router", version="1", responses=ERROR_RESPONSES,
                  lifespan=lifespan)
    app.add_middleware(AuthGate, status=lambda token: _status(ctx, token, "*"),
                       retry_after_s=RETRY_AFTER_S)

    @app.exception_handler(ServingError)
    async def _serving(_r: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ControlPlaneError)
    async def _control_plane(_r: Request, _exc: ControlPlaneError) -> JSONResponse:
        return control_plane_unavailable(RETRY_AFTER_S)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code,
                                                                 f"HTTP_{exc.status_code}")
        return JSONResponse(error_body(exc.status_code, code, str(exc.detail)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

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
        token = _token(request)
        if await _status(ctx, token, "*") == 401:
            raise Unauthenticated("unknown or revoked token")
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "owned_by": "adapterplane"}
            for name in sorted(ctx.table.base_names)]
        allowed: dict[str, bool] = {}
        for (namespace, name), alias in sorted(ctx.table.aliases.items()):
            if alias.digest is None:
                continue
            if namespace not in allowed:
                allowed[namespace] = await _status(ctx, token, namespace) == 200
            if allowed[namespace]:
                data.append({"id": f"{namespace}/{name}", "object": "model",
                             "owned_by": namespace,
                             "adapterplane": {"namespace": namespace, "alias": name,
                                              "generation": alias.current_generation,
                                              "artifact_digest": alias.digest}})
        return {"object": "list", "data": data}

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _handle(ctx, request, "/v1/completions")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await _handle(ctx, request, "/v1/chat/completions")

    return app


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


def _token(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated("missing bearer token")
    return value.strip()


async def _status(ctx: RouterContext, token: str, namespace: str) -> int:
    cached = ctx.client.cached_read(token, namespace)
    if cached is not None:
        return cached
    return await asyncio.to_thread(ctx.client.can_read, token, namespace)


async def _read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _resolve(ctx: RouterContext, token: str, model: str) -> tuple[Target, str]:
    """What the request needs and the `model` to forward (see module docstring)."""
    table = ctx.table
    base = table.base_names.get(model)
    if base is not None:
        return Target(base=base), model
    ref = ModelRef.parse(model)
    status = await _status(ctx, token, ref.namespace)
    if status == 401:
        raise Unauthenticated("unknown or revoked token")
    if status != 200:
        raise Forbidden(f"token lacks read on namespace {ref.namespace!r}",
                        namespace=ref.namespace)
    alias = table.aliases.get((ref.namespace, ref.alias))
    if alias is None:
        await ctx.refresh_now()
        alias = table.aliases.get((ref.namespace, ref.alias))
    if alias is None:
        raise UnknownAlias(f"unknown alias {ref.namespace}/{ref.alias}", model=model)
    if ref.generation is None or ref.generation == alias.current_generation:
        if alias.digest is None:
            raise AliasRetired(f"{ref.namespace}/{ref.alias} is retired",
                               generation=alias.current_generation)
        target = Target(base=alias.base, digest=alias.digest, rank=alias.rank,
                        roles=frozenset(alias.roles))
        return target, f"{ref.namespace}/{ref.alias}@{alias.current_generation}"
    # an older (or unknown) pinned generation: the agent resolves it; route by the alias's
    # base, one ring point per pinned generation
    return Target(base=alias.base, digest=f"{model}"), model


async def _handle(ctx: RouterContext, request: Request, path: str) -> Response:
    started = time.perf_counter()
    try:
        token = _token(request)
        raw = await _read_body(request, ctx.settings.max_body_bytes)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise BadModelName(f"the body is not JSON: {exc}", param="body") from exc
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            raise BadModelName("model: field required (a string)", param="model")
        target, forwarded = await _resolve(ctx, token, model)
        body["model"] = forwarded
        now = time.monotonic()
        order = route(target, ctx.table.views, ctx.local, now, ctx.table.lease_s)
        if not order:
            raise NoAgent(_no_agent_message(ctx, target), retry_after_s=RETRY_AFTER_S)
    except ServingError:
        ctx.metrics.requests.labels("refused").inc()
        raise
    ctx.metrics.overhead.observe(time.perf_counter() - started)
    payload = json.dumps(body, separators=(",", ":")).encode()
    return await _forward(ctx, request, path, payload, body.get("stream") is True, order,
                          target)


def _no_agent_message(ctx: RouterContext, target: Target) -> str:
    lease = ctx.table.lease_s
    if not any(feasible(v, target, float("inf")) or v.drain for v in ctx.table.views):
        return "no agent serves this base model with the adapter's rank and targets"
    if all(v.drain or v.heartbeat_age_s > lease for v in ctx.table.views
           if v.base == target.base):
        return "every agent that serves this model is draining or not heartbeating"
    return "every agent that serves this model failed a moment ago; retry shortly"


async def _forward(ctx: RouterContext, request: Request, path: str, payload: bytes,
                   stream: bool, order: Sequence[AgentView], target: Target) -> Response:
    assert ctx.agents is not None, "the app's lifespan opens the agent session"
    headers = {"Authorization": request.headers["authorization"],
               "Content-Type": "application/json"}
    last: Response | None = None
    for view in order[:ctx.settings.max_attempts]:
        agent = ctx.table.agents.get(view.agent_id)
        if agent is None:
            continue
        inflight = ctx.local.inflight
        inflight[view.agent_id] = inflight.get(view.agent_id, 0) + 1
        handed_off = False
        try:
            cold = _mark_cold(ctx, view, target)
            try:
                upstream = await ctx.agents.post(agent.url.rstrip("/") + path, data=payload,
                                                 headers=headers)
            except UPSTREAM_ERRORS as exc:
                _unmark_cold(ctx, cold, view)
                last = _agent_lost(ctx, view.agent_id, agent.name, exc)
                continue
            status = upstream.status
            if status >= 500 or status == 429:
                _unmark_cold(ctx, cold, view)
                refusal = await _read_quietly(upstream)
                ctx.metrics.attempts.labels("status_429" if status == 429 else "status_5xx").inc()
                last = Response(refusal, status, headers=_answer_headers(upstream, agent.name))
                continue
            ctx.metrics.attempts.labels("ok").inc()
            if stream and status == 200:
                handed_off = True
                ctx.metrics.requests.labels("ok").inc()
                return StreamingResponse(_relay(ctx, upstream, view.agent_id), status_code=200,
                                         headers=_answer_headers(upstream, agent.name))
            try:
                content = await _read_watching(upstream, request)
            except UPSTREAM_ERRORS as exc:  # nothing reached the client yet
                last = _agent_lost(ctx, view.agent_id, agent.name, exc)
                continue
            if content is None:  # the client went away; the agent aborts on our close
                return Response(status_code=499)
            ctx.metrics.requests.labels("ok" if status < 400 else "refused").inc()
            return Response(content, status, headers=_answer_headers(upstream, agent.name))
        finally:
            if not handed_off:
                inflight[view.agent_id] -= 1
    ctx.metrics.requests.labels("failed").inc()
    return last if last is not None else error_response(NoAgent("no agent could take the request",
                                                        retry_after_s=RETRY_AFTER_S))


def _mark_cold(ctx: RouterContext, view: AgentView, target: Target) -> str | None:
    """Sending `target`'s adapter to an agent that neither holds it nor has it on its way:
    mark it there (its next requests follow it while it loads); the digest, or None."""
    digest = target.digest
    if digest is None or digest in view.resident or digest in view.arriving:
        return None
    ctx.metrics.cold_routes.inc()
    ctx.local.sent_cold.setdefault(digest,
                                   (view.agent_id, time.monotonic() + ctx.settings.cold_mark_s))
    return digest


def _unmark_cold(ctx: RouterContext, digest: str | None, view: AgentView) -> None:
    """The agent refused or failed the request: it is not loading the adapter for us."""
    if digest is not None and ctx.local.sent_cold.get(digest, (None,))[0] == view.agent_id:
        del ctx.local.sent_cold[digest]


def _agent_lost(ctx: RouterContext, agent_id: int, name: str, exc: BaseException) -> Response:
    """A connection to the agent failed: skip it for `down_s`; the answer if none is left."""
    ctx.local.down_until[agent_id] = time.monotonic() + ctx.settings.down_s
    ctx.metrics.attempts.labels("connect").inc()
    log.warning("agent %s: %s; trying the next agent", name, exc)
    return error_response(UpstreamFailed(f"agent {name} could not be reached: {type(exc).__name__}",
                                 agent=name, retry_after_s=RETRY_AFTER_S))


def _answer_headers(upstream: aiohttp.ClientResponse, agent_name: str) -> dict[str, str]:
    out = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_HEADERS}
    out["X-Adapterplane-Agent"] = agent_name
    return out


async def _read_quietly(upstream: aiohttp.ClientResponse) -> bytes:
    try:
        return await upstream.read()
    except UPSTREAM_ERRORS:
        return b""
    finally:
        upstream.release()


async def _read_watching(upstream: aiohttp.ClientResponse, request: Request) -> bytes | None:
    """The whole answer, or None (and the connection closed) once the client disconnects."""
    read = asyncio.ensure_future(upstream.read())
    try:
        while True:
            done, _ = await asyncio.wait({read}, timeout=DISCONNECT_POLL_S)
            if done:
                return read.result()
            if await request.is_disconnected():
                read.cancel()
                upstream.close()
                return None
    finally:
        if not read.done():
            read.cancel()
        upstream.release()


def _event_end(buffer: bytes) -> int:
    """Length of the complete SSE events at the start of `buffer` (0: none yet)."""
    return max(buffer.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in buffer else 0,
               buffer.rfind(b"\n\n") + 2 if b"\n\n" in buffer else 0)


async def _relay(ctx: RouterContext, upstream: aiohttp.ClientResponse, agent_id: int
                 ) -> AsyncIterator[bytes]:
    """The agent's SSE stream, whole events only; a break ends it with an error event."""
    buffer = b""
    finished = False
    try:
        async for chunk in upstream.content.iter_any():
            buffer += chunk
            end = _event_end(buffer)
            if end:
                yield buffer[:end]
                buffer = buffer[end:]
        if buffer:
            yield buffer
        finished = True
    except UPSTREAM_ERRORS as exc:
        ctx.metrics.requests.labels("interrupted").inc()
        ctx.local.down_until[agent_id] = time.monotonic() + ctx.settings.down_s
        event = error_body(502, "UPSTREAM_INTERRUPTED",
                           f"the agent serving this stream failed mid-stream "
                           f"({type(exc).__name__}); the output so far is incomplete")
        yield f"data: {json.dumps(event)}\n\n".encode()
    finally:
        ctx.local.inflight[agent_id] -= 1
        if finished:
            upstream.release()
        else:  # a broken or abandoned stream: drop the connection (the agent aborts)
            upstream.close()


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
