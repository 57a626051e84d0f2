"""The router's request path: admit, route and relay one completion (pure ASGI).

`POST /v1/completions` and `/v1/chat/completions` (SSE included) are admitted here and
forwarded to one agent:

1. The caller was authenticated before the body is read (the agents' auth gate in front
   of this app: same tokens and namespace scopes); here it is authorized for the alias's
   namespace (cached per token by the control-plane client).
2. `namespace/alias` is resolved on the router's replica of the catalog
   (agent/router/table.py) to its current generation, and forwarded as
   `namespace/alias@generation`, so the agent serves exactly the generation the request
   was admitted under (404 unknown, 410 retired, as the agents answer); a generation
   serving a merged release goes to the agents of the release's base. A pinned
   `@generation` is forwarded as given; the bare base model's name routes to any agent
   serving that base.
3. :func:`agent.router.routing.route` orders the agents; the request goes to the first.
   A connection failure, a 5xx or a 429 before the first byte of the answer moves it to
   the next (up to `max_attempts`): nothing reached the client, so nothing is
   duplicated. A stream that breaks after its first byte ends with an error event
   (`{"error": {"code": "UPSTREAM_INTERRUPTED"}}`), never with another agent's tokens.
   Events are relayed whole, so a break never leaves half an event.
4. A client that goes away while an agent works closes the agent's connection, which
   aborts the request there (streaming or not).

The client's own bearer token is forwarded: agents check it again (cached), so a router
cannot widen anyone's access. Answers carry `X-Adapterplane-Agent` (the agent's name).

These two routes are plain ASGI, without the web framework: a router's cost is its CPU
per request, and the framework's layers (route matching, dependency solving, response
classes, the streaming response's task group) were about half of it. Everything else
(health, metrics, `/v1/models`) is the FastAPI app behind (agent/router/server.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence

import aiohttp
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.auth_gate import control_plane_unavailable
from agent.catalog import (
    AliasRetired,
    BadModelName,
    Forbidden,
    ModelRef,
    ServingError,
    Unauthenticated,
    UnknownAlias,
)
from agent.openai_errors import error_body, error_response
from agent.router.context import RouterContext
from agent.router.routing import AgentView, Target, feasible, route
from agent.sync import ControlPlaneError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
INFERENCE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
PASSED_HEADERS = frozenset({"content-type", "retry-after", "cache-control"})
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


class ClientGone(Exception):
    """The client disconnected before its request was admitted."""


class InferenceRelay:
    """Serves the inference routes itself; hands every other request to `app`."""

    def __init__(self, app: ASGIApp, ctx: RouterContext) -> None:
        self.app, self.ctx = app, ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await JSONResponse(error_body(405, "METHOD_NOT_ALLOWED", "Method Not Allowed"),
                               status_code=405, headers={"Allow": "POST"}
                               )(scope, receive, send)
            return
        try:
            await _serve(self.ctx, scope, receive, send)
        except ServingError as exc:
            self.ctx.metrics.outcome["refused"].inc()
            await error_response(exc)(scope, receive, send)
        except ControlPlaneError:
            self.ctx.metrics.outcome["refused"].inc()
            await control_plane_unavailable(RETRY_AFTER_S)(scope, receive, send)
        except ClientGone:
            pass


def bearer(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            break
    raise Unauthenticated("missing bearer token")


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _serve(ctx: RouterContext, scope: Scope, receive: Receive, send: Send) -> None:
    started = time.perf_counter()
    token = bearer(scope)
    raw = await _read_body(receive, ctx.settings.max_body_bytes)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadModelName(f"the body is not JSON: {exc}", param="body") from exc
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str):
        raise BadModelName("model: field required (a string)", param="model")
    target, forwarded = await _resolve(ctx, token, model)
    body["model"] = forwarded
    order = route(target, ctx.table.views, ctx.local, time.monotonic(), ctx.table.lease_s)
    if not order:
        raise NoAgent(_no_agent_message(ctx, target), retry_after_s=RETRY_AFTER_S)
    payload = json.dumps(body, separators=(",", ":")).encode()
    ctx.metrics.overhead.observe(time.perf_counter() - started)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    watch = ClientWatch(receive)
    try:
        await _forward(ctx, scope, send, watch, scope["path"], payload, headers,
                       body.get("stream") is True, order, target)
    finally:
        watch.close()


async def _resolve(ctx: RouterContext, token: str, model: str) -> tuple[Target, str]:
    """What the request needs and the `model` to forward (see module docstring)."""
    table = ctx.table
    base = table.base_names.get(model)
    if base is not None:
        return Target(base=base), model
    ref = ModelRef.parse(model, table.base_names)
    status = await ctx.can_read(token, ref.namespace)
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
        pinned = f"{ref.namespace}/{ref.alias}@{alias.current_generation}"
        if alias.release is not None:  # a merged release: any agent of its base, no adapter
            return Target(base=alias.release.base), pinned
        if alias.digest is None:
            raise AliasRetired(f"{ref.namespace}/{ref.alias} is retired",
                               generation=alias.current_generation)
        target = Target(base=alias.base, digest=alias.digest, rank=alias.rank,
                        roles=frozenset(alias.roles))
        return target, pinned
    # an older (or unknown) pinned generation: the agent resolves it; route by the alias's
    # base, one ring point per pinned generation
    return Target(base=alias.base, digest=model), model


def _no_agent_message(ctx: RouterContext, target: Target) -> str:
    lease = ctx.table.lease_s
    if not any(feasible(v, target, float("inf")) or v.drain for v in ctx.table.views):
        return "no agent serves this base model with the adapter's rank and targets"
    if all(v.drain or v.heartbeat_age_s > lease for v in ctx.table.views
           if v.base == target.base):
        return "every agent that serves this model is draining or not heartbeating"
    return "every agent that serves this model failed a moment ago; retry shortly"


class ClientWatch:
    """Notices the client leaving while an agent works on its request.

    `task` waits on the request's `receive()`: the server answers `http.disconnect` when
    the client closes its connection (and once the answer is complete, which comes after
    :meth:`close` and is ignored). A client gone closes the attached agent response,
    which drops that connection and aborts the request at the agent.
    """

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._closed = False
        self._upstream: aiohttp.ClientResponse | None = None
        self.task = asyncio.ensure_future(receive())
        self.task.add_done_callback(self._on_message)

    def _on_message(self, task: asyncio.Future[Message]) -> None:
        if self._closed or task.cancelled() or task.exception() is not None:
            return
        self.gone = True
        if self._upstream is not None:
            self._upstream.close()

    def attach(self, upstream: aiohttp.ClientResponse) -> None:
        self._upstream = upstream
        if self.gone:
            upstream.close()

    def close(self) -> None:
        self._closed = True
        self.task.cancel()


async def _exchange(ctx: RouterContext, url: str, payload: bytes, headers: dict[str, str],
                    stream: bool) -> tuple[aiohttp.ClientResponse, bytes | None]:
    """Send the request; the response with its whole body, or with None for a stream the
    agent accepted (its body still to relay)."""
    assert ctx.agents is not None, "the app's lifespan opens the agent session"
    upstream = await ctx.agents.post(url, data=payload, headers=headers)
    if stream and upstream.status == 200:
        return upstream, None
    try:
        content = await upstream.read()
    except BaseException:
        upstream.close()
        raise
    upstream.release()
    return upstream, content


async def _forward(ctx: RouterContext, scope: Scope, send: Send, watch: ClientWatch,
                   path: str, payload: bytes, headers: dict[str, str], stream: bool,
                   order: Sequence[AgentView], target: Target) -> None:
    metrics = ctx.metrics
    last: Response | None = None
    for view in order[:ctx.settings.max_attempts]:
        agent = ctx.table.agents.get(view.agent_id)
        if agent is None:
            continue
        inflight = ctx.local.inflight
        inflight[view.agent_id] = inflight.get(view.agent_id, 0) + 1
        relayed = False
        try:
            cold = _mark_cold(ctx, view, target)
            call = asyncio.ensure_future(
                _exchange(ctx, agent.url.rstrip("/") + path, payload, headers, stream))
            await asyncio.wait((call, watch.task), return_when=asyncio.FIRST_COMPLETED)
            if not call.done():  # the client left; cancelling closes the agent connection
                call.cancel()
                _unmark_cold(ctx, cold, view)
                return
            try:
                upstream, content = call.result()
            except UPSTREAM_ERRORS as exc:
                _unmark_cold(ctx, cold, view)
                last = _agent_lost(ctx, view.agent_id, agent.name, exc)
                continue
            status = upstream.status
            answer_headers = _answer_headers(upstream, agent.name)
            if status >= 500 or status == 429:
                _unmark_cold(ctx, cold, view)
                metrics.attempt["status_429" if status == 429 else "status_5xx"].inc()
                last = Response(content, status,
                                headers={k.decode(): v.decode() for k, v in answer_headers})
                continue
            metrics.attempt["ok"].inc()
            if content is None:
                relayed = True
                metrics.outcome["ok"].inc()
                await _relay(ctx, upstream, view.agent_id, send, watch, answer_headers)
                return
            metrics.outcome["ok" if status < 400 else "refused"].inc()
            answer_headers.append((b"content-length", str(len(content)).encode()))
            await send({"type": "http.response.start", "status": status,
                        "headers": answer_headers})
            await send({"type": "http.response.body", "body": content})
            return
        finally:
            if not relayed:
                inflight[view.agent_id] -= 1
    metrics.outcome["failed"].inc()
    if last is None:
        last = error_response(NoAgent("no agent could take the request",
                                      retry_after_s=RETRY_AFTER_S))
    await last(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


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
    ctx.metrics.attempt["connect"].inc()
    log.warning("agent %s: %s; trying the next agent", name, exc)
    return error_response(UpstreamFailed(f"agent {name} could not be reached: {type(exc).__name__}",
                                 agent=name, retry_after_s=RETRY_AFTER_S))


def _answer_headers(upstream: aiohttp.ClientResponse, agent_name: str
                    ) -> list[tuple[bytes, bytes]]:
    out = [(k.lower().encode(), v.encode()) for k, v in upstream.headers.items()
           if k.lower() in PASSED_HEADERS]
    out.append((b"x-adapterplane-agent", agent_name.encode()))
    return out


def _event_end(buffer: bytes) -> int:
    """Length of the complete SSE events at the start of `buffer` (0: none yet)."""
    return max(buffer.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in buffer else 0,
               buffer.rfind(b"\n\n") + 2 if b"\n\n" in buffer else 0)


async def _relay(ctx: RouterContext, upstream: aiohttp.ClientResponse, agent_id: int,
                 send: Send, watch: ClientWatch, headers: list[tuple[bytes, bytes]]) -> None:
    """The agent's SSE stream, whole events only; a break ends it with an error event."""
    buffer = b""
    tail = b""
    watch.attach(upstream)
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in upstream.content.iter_any():
            buffer += chunk
            end = _event_end(buffer)
            if end:
                await send({"type": "http.response.body", "body": buffer[:end],
                            "more_body": True})
                buffer = buffer[end:]
        tail = buffer
        upstream.release()
    except UPSTREAM_ERRORS as exc:
        upstream.close()
        if watch.gone:  # the client left: its connection is gone, nothing to say
            return
        ctx.metrics.outcome["interrupted"].inc()
        ctx.local.down_until[agent_id] = time.monotonic() + ctx.settings.down_s
        event = error_body(502, "UPSTREAM_INTERRUPTED",
                           f"the agent serving this stream failed mid-stream "
                           f"({type(exc).__name__}); the output so far is incomplete")
        tail = f"data: {json.dumps(event)}\n\n".encode()
    except BaseException:
        upstream.close()
        raise
    finally:
        ctx.local.inflight[agent_id] -= 1
    await send({"type": "http.response.body", "body": tail, "more_body": False})
