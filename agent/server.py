"""The agent's HTTP API (FastAPI): OpenAI-compatible inference, health, metrics, state.

`model` is `namespace/alias` (current generation), `namespace/alias@generation` (pinned)
or the served base model name. The alias is resolved once, at admission; the response
names what it ran on in `adapterplane: {namespace, alias, generation, artifact_digest}`
(null for the base model). Errors are OpenAI's error object with the product's stable
code (agent/openai_errors.py; POSTs are authenticated before their body is read,
agent/auth_gate.py): 401/403 token, 404 unknown alias, 410 retired, 422
unsupported rank/target or bad input, 429 overloaded, 503 adapter load failed. No error
is ever answered by running the base model or another adapter instead.

A response starts only after the request produced its first token (or failed), so
every failure before that — including a cold load that fails — is a proper HTTP error.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.auth_gate import AuthGate
from agent.catalog import (
    AgentCatalog,
    Forbidden,
    Generation,
    ModelRef,
    ServingError,
    Unauthenticated,
    UnknownAlias,
    Unsupported,
    WrongBase,
    parse_generations,
)
from agent.error_handlers import install_error_handlers
from agent.mailbox import Mailbox
from agent.metrics import AgentMetrics
from agent.openai_choices import children, returned
from agent.openai_errors import ERROR_RESPONSES, error_body, error_response
from agent.openai_responses import Answer, Echo
from agent.openai_schemas import ChatCompletionRequest, CompletionRequest
from agent.openai_stream import Inbox, TokenStream
from agent.serving import BadPrompt, EngineLoop, Event, Ticket
from agent.sync import ControlPlaneClient
from agent.tickets import BadResponseFormat, NotInvoked, UnsupportedParameter
from dataplane.core import EngineError, InvalidResponseFormat, SamplingParams
from dataplane.engine.activation import activation_offset
from dataplane.engine.engine import RequestOutput

CONTROL_PLANE_RETRY_S = 1
"""`Retry-After` of a 503 answered while the control plane cannot be reached."""
READY: dict[str, Any] = {"type": "object", "required": ["status"],
                         "properties": {"status": {"enum": ["ready", "not_ready",
                                                            "draining"]}}}
"""Body of `/readyz`: ready (200), not ready yet or shutting down, or draining (503)."""
DISCONNECT_POLL_S = 0.25
"""How often a waiting non-streaming request checks that its client is still there."""


@dataclass
class ServingContext:
    """What the HTTP layer needs from the daemon."""

    catalog: AgentCatalog
    loop: EngineLoop
    metrics: AgentMetrics
    client: ControlPlaneClient | None
    served_model_name: str
    max_rank: int
    targets: frozenset[str]
    h_base: str = ""
    """H_base of the model this agent serves (generations of another base are refused)."""
    require_auth: bool = True
    max_queue_ms: int | None = None
    """The default of a request's `max_queue_ms` (None: requests wait as long as it takes)."""
    max_tokens_limit: int | None = None
    """Largest `max_tokens` a request may ask for (None: the model's context)."""
    state: dict[str, Any] = field(default_factory=dict)
    """agent_id, worker_epoch, ready, draining (set by the daemon)."""
    mailbox: Mailbox | None = None
    """Engine events into the server's event loop (made by the first request)."""

    def mailbox_for(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        if self.mailbox is None or self.mailbox.loop is not loop:
            self.mailbox = Mailbox(loop)
        return self.mailbox


def create_agent_app(ctx: ServingContext) -> FastAPI:
    app = FastAPI(title="Adapterplane agent", version="1", responses=ERROR_RESPONSES)
    if ctx.require_auth:
        app.add_middleware(AuthGate, status=lambda token: _status(ctx, token, "*"),
                           retry_after_s=CONTROL_PLANE_RETRY_S)

    install_error_handlers(app, CONTROL_PLANE_RETRY_S)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")}
                  for e in exc.errors()]
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(loc)}: {first['msg']}" if loc and "msg" in first else (
            "invalid request")
        return JSONResponse(error_body(
            422, "VALIDATION_ERROR", message, param=".".join(loc) or None,
            detail={"errors": json.loads(json.dumps(errors, default=str))}), status_code=422)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready yet (or draining).",
                                         "content": {"application/json": {"schema": READY}}},
                                   200: {"content": {"application/json": {"schema": READY}}}})
    async def readyz() -> JSONResponse:
        # draining (the control plane asked): 503 so a Service stops sending new traffic;
        # requests that still arrive are served
        if not ctx.state.get("ready"):
            return JSONResponse({"status": "not_ready"}, status_code=503)
        if ctx.state.get("draining"):
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ready"}, status_code=200)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition format."}})
    async def metrics() -> Response:
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/agent/state")
    async def agent_state(request: Request) -> dict[str, Any]:
        await _require_operator(ctx, request)
        return {**ctx.state, "served_model_name": ctx.served_model_name,
                "catalog_version": ctx.catalog.version, **ctx.loop.status,
                "tenants": ctx.loop.tenant_state(), "admission": ctx.loop.admission_state()}

    @app.get("/v1/agent/top")
    async def agent_top(request: Request,
                        k: int = Query(default=10, ge=1, le=100)) -> dict[str, Any]:
        await _require_operator(ctx, request)
        return ctx.loop.top(k)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        token = _token(request, ctx)
        if token is not None and ctx.require_auth and await _status(ctx, token, "*") == 401:
            raise Unauthenticated("unknown or revoked token")
        data: list[dict[str, Any]] = [
            {"id": ctx.served_model_name, "object": "model", "owned_by": "adapterplane"}]
        for gen in ctx.catalog.current():
            if gen.artifact is None:
                continue
            if token is not None and await _status(ctx, token, gen.namespace) != 200:
                continue
            data.append({"id": gen.name, "object": "model", "owned_by": gen.namespace,
                         "adapterplane": _binding(gen)})
        return {"object": "list", "data": data}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _serve(ctx, request, body.model, body.prompts(), body, "text_completion")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        tokenizer = ctx.loop.engine.tokenizer
        if tokenizer is None:
            raise BadPrompt("this model has no tokenizer/chat template")
        try:
            prompt = tokenizer.encode_chat([m.model_dump(exclude_none=True)
                                            for m in body.messages], add_generation_prompt=True)
        except Exception as exc:
            raise BadPrompt(f"chat template failed: {exc}") from exc
        return await _serve(ctx, request, body.model, [prompt], body, "chat.completion")

    return app


def _token(request: Request, ctx: ServingContext) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if ctx.require_auth:
        raise Unauthenticated("missing bearer token")
    return None


async def _require_operator(ctx: ServingContext, request: Request) -> None:
    """The agent's own state names every namespace's adapters and requests: it needs a
    token that reads every namespace (an agent token, or read on `*`)."""
    if not ctx.require_auth:
        return
    status = await _status(ctx, _token(request, ctx) or "", "*")
    if status == 401:
        raise Unauthenticated("unknown or revoked token")
    if status != 200:
        raise Forbidden("this endpoint needs an agent token or read on every namespace ('*')",
                        namespace="*")


async def _status(ctx: ServingContext, token: str, namespace: str) -> int:
    if ctx.client is None:
        return 200
    cached = ctx.client.cached_read(token, namespace)  # the hot path: no thread hop
    if cached is not None:
        return cached
    return await asyncio.to_thread(ctx.client.can_read, token, namespace)


def _binding(gen: Generation | None) -> dict[str, Any] | None:
    if gen is None:
        return None
    where = {"namespace": gen.namespace, "alias": gen.alias, "generation": gen.generation}
    if gen.release is not None:
        return {**where, "release_digest": gen.release.digest, "base": gen.release.base}
    if gen.artifact is None:
        return None
    return {**where, "artifact_digest": gen.artifact.digest}


def _check_invoked(ctx: ServingContext, gen: Generation, prompt: str | list[int]) -> None:
    """An activated LoRA's prompt must invoke it: refused here, before any cold load (the
    engine applies the same rule to the same token ids when the request reaches it)."""
    tokens = gen.artifact.invocation_tokens if gen.artifact is not None else None
    if tokens is None:
        return
    ids = ctx.loop.engine.encode(prompt) if isinstance(prompt, str) else prompt
    if activation_offset(ids, tokens) is None:
        raise NotInvoked("the prompt does not contain the adapter's invocation tokens",
                         invocation_tokens=list(tokens))


def _token_text(ctx: ServingContext) -> Callable[[int], str]:
    """A token id's text for logprobs (its id as text when the model has no tokenizer)."""
    tokenizer = ctx.loop.engine.tokenizer
    if tokenizer is None:
        return str
    return lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)


async def _admit(ctx: ServingContext, request: Request, model: str) -> Generation | None:
    """Auth, then resolve once (404/410), then capability checks (422)."""
    token = _token(request, ctx)
    if model == ctx.served_model_name:
        if token is not None and ctx.require_auth and await _status(ctx, token, "default") == 401:
            raise Unauthenticated("unknown or revoked token")
        return None
    ref = ModelRef.parse(model, [ctx.served_model_name])
    if token is not None and ctx.require_auth:
        status = await _status(ctx, token, ref.namespace)
        if status == 401:
            raise Unauthenticated("unknown or revoked token")
        if status != 200:
            raise Forbidden(f"token lacks read on namespace {ref.namespace!r}",
                            namespace=ref.namespace)
    try:
        gen = ctx.catalog.resolve(ref)
    except UnknownAlias:
        if ref.generation is None or not await _fetch_pinned(ctx, ref):
            raise
        gen = ctx.catalog.resolve(ref)
    if ctx.h_base and gen.serving_base and gen.serving_base != ctx.h_base:
        what = "merged release" if gen.release is not None else "adapter"
        raise WrongBase(f"{gen.name}@{gen.generation} serves a {what} of base "
                        f"{gen.serving_base[:12]}…; this agent serves base {ctx.h_base[:12]}…",
                        model=gen.name, generation=gen.generation, base=gen.serving_base)
    if gen.artifact is None:  # a merged release of this agent's base: no adapter
        return gen
    if gen.artifact.max_rank > ctx.max_rank:
        raise Unsupported(f"adapter rank {gen.artifact.max_rank} exceeds this agent's max "
                          f"rank {ctx.max_rank}", rank=gen.artifact.max_rank)
    missing = gen.artifact.roles - ctx.targets
    if missing:
        raise Unsupported(f"adapter targets {sorted(missing)} are not served here",
                          targets=sorted(missing))
    return gen


async def _fetch_pinned(ctx: ServingContext, ref: ModelRef) -> bool:
    """Fetch a pinned generation the replica lacks from the control plane into the
    catalog; False when the catalog has no such generation."""
    agent_id, epoch = ctx.state.get("agent_id"), ctx.state.get("worker_epoch")
    if ctx.client is None or agent_id is None or epoch is None or ref.generation is None:
        return False
    doc = await asyncio.to_thread(ctx.client.pinned_generation, agent_id, epoch,
                                  ref.namespace, ref.alias, ref.generation)
    if doc is None:
        return False
    gen = parse_generations(doc).get(ref.generation)
    if gen is None:
        return False
    ctx.catalog.remember(gen)
    return True


async def _serve(ctx: ServingContext, request: Request, model: str,
                 prompts: list[str | list[int]],
                 body: CompletionRequest | ChatCompletionRequest, kind: str) -> Response:
    try:
        gen = await _admit(ctx, request, model)  # authentication first, then the body
        if isinstance(body, CompletionRequest) and body.max_tokens == 0 and not body.echo:
            raise BadPrompt("max_tokens must be >= 1 (0 only with echo: true)",
                            param="max_tokens")
        unsupported = body.unsupported()
        if unsupported is not None:
            raise UnsupportedParameter(f"{unsupported} is not supported by this server",
                                       param=unsupported)
        if gen is not None and not body.alora_base_if_not_invoked:
            for prompt in prompts:
                _check_invoked(ctx, gen, prompt)
        try:
            params = [body.sampling(_default_max_tokens(ctx, p, kind)) for p in prompts]
            fmt = params[0].response_format
            if fmt is not None:  # compiled (and cached) off the engine thread
                await asyncio.to_thread(ctx.loop.engine.grammar_compiler().compile, fmt)
        except InvalidResponseFormat as exc:
            raise BadResponseFormat(exc.message, param="response_format") from exc
        _check_max_tokens(ctx, body, prompts, params)
        vocab = ctx.loop.engine.model.config.vocab_size
        bias = params[0].logit_bias
        if bias and bias[-1][0] >= vocab:
            raise BadPrompt(f"logit_bias token ids must be < vocab size {vocab}",
                            param="logit_bias", token_id=bias[-1][0])
    except ServingError as exc:
        ctx.metrics.rejected.labels(exc.code.lower()).inc()
        raise
    except EngineError as exc:
        raise BadPrompt(str(exc), code=exc.code) from exc
    inbox = Inbox()
    events = inbox.queue
    mailbox = ctx.mailbox_for(asyncio.get_running_loop())
    request_id = f"{'chatcmpl' if kind != 'text_completion' else 'cmpl'}-{uuid.uuid4().hex}"
    kids = children(request_id, prompts, params, body.samples, body.samples > body.n)

    def sink(k: int) -> Callable[[Event], None]:
        def put(event: Event) -> None:
            mailbox.post(inbox, (k, event))
        return put

    def abort_all() -> None:
        for kid in kids:
            ctx.loop.abort(kid.request_id)

    max_queue_ms = body.max_queue_ms or ctx.max_queue_ms
    watch = _Client(request)
    for k, kid in enumerate(kids):
        ctx.loop.submit(Ticket(kid.request_id, kid.prompt, kid.params, gen, sink(k),
                               max_queue_s=None if max_queue_ms is None else max_queue_ms / 1e3,
                               base_if_not_invoked=body.alora_base_if_not_invoked,
                               prefill_after=kid.prefill_after))
    try:
        started = await _until_started(events, len(kids), watch)
    except asyncio.CancelledError:
        abort_all()
        raise
    if started is None:  # the client went away before the first token
        abort_all()
        return Response(status_code=499)
    failed = next((e for _, e in started if isinstance(e, ServingError)), None)
    if failed is not None:
        abort_all()
        ctx.metrics.rejected.labels(failed.code.lower()).inc()
        return error_response(failed)
    answer = Answer(request_id, kind, model, int(time.time()), _binding(gen),
                    _token_text(ctx), show_logprobs=body.top_logprobs_wanted() is not None,
                    echo=_echo(ctx, body, prompts))
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return TokenStream(ctx.loop, answer, kids, body.n, started, inbox, include_usage)
    finals: dict[str, RequestOutput] = {}
    backlog = list(started)
    try:
        while len(finals) < len(kids):
            got = backlog.pop(0) if backlog else await watch.next(events)
            if got is None:  # the client went away: stop generating for it
                abort_all()
                return Response(status_code=499)
            k, event = got
            if isinstance(event, ServingError):
                abort_all()
                return error_response(event)
            if event.finished:
                finals[kids[k].request_id] = event
    except asyncio.CancelledError:  # the client went away: stop generating for it
        abort_all()
        raise
    firsts = [finals[kid.request_id] for kid in kids if kid.sample == 0]
    if answer.echo is not None:
        for p, first in enumerate(firsts):
            answer.echo.learn(p, first)
    chosen = [(i, kid.prompt_index, finals[kid.request_id])
              for i, kid in returned(kids, finals, body.n)]
    generated = () if answer.echo is not None and answer.echo.drop_completion else list(
        finals.values())
    return JSONResponse(answer.full(chosen, Answer.usage(firsts, generated)))


def _echo(ctx: ServingContext, body: CompletionRequest | ChatCompletionRequest,
          prompts: list[str | list[int]]) -> Echo | None:
    """Completions' echo: the prompt texts (token-id prompts decoded)."""
    if not isinstance(body, CompletionRequest) or not body.echo:
        return None
    tokenizer = ctx.loop.engine.tokenizer

    def text(p: str | list[int]) -> str:
        if isinstance(p, str):
            return p
        return "" if tokenizer is None else tokenizer.decode(p, skip_special_tokens=False)
    return Echo([text(p) for p in prompts], drop_completion=body.max_tokens == 0)


class _Client:
    """Whether a non-streaming request's client is still there, checked at most every
    DISCONNECT_POLL_S (also while events keep arriving)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.checked = time.monotonic()

    async def next(self, events: asyncio.Queue[tuple[int, Event]]
                   ) -> tuple[int, Event] | None:
        """The next sample event, or None once the client has disconnected."""
        while True:
            now = time.monotonic()
            if now - self.checked >= DISCONNECT_POLL_S:
                self.checked = now
                if await self.request.is_disconnected():
                    return None
            try:
                return await asyncio.wait_for(events.get(), timeout=DISCONNECT_POLL_S)
            except TimeoutError:
                continue


async def _until_started(events: asyncio.Queue[tuple[int, Event]], count: int,
                         client: _Client) -> list[tuple[int, Event]] | None:
    """The events received until each of `count` samples produced its first token, or
    until one failed (so every failure before any output is a proper HTTP error); None
    when the client disconnected first."""
    got: list[tuple[int, Event]] = []
    seen: set[int] = set()
    while len(seen) < count:
        nxt = await client.next(events)
        if nxt is None:
            return None
        k, event = nxt
        got.append((k, event))
        if isinstance(event, ServingError):
            break
        seen.add(k)
    return got


def _check_max_tokens(ctx: ServingContext, body: CompletionRequest | ChatCompletionRequest,
                      prompts: list[str | list[int]], params: list[SamplingParams]) -> None:
    """An explicit `max_tokens` (or `max_completion_tokens`) above the agent's limit, or
    beyond the model's context after the prompt, is refused (422 naming the field)."""
    asked = body.max_tokens if body.max_tokens is not None else getattr(
        body, "max_completion_tokens", None)
    if not asked:
        return
    name = "max_tokens" if body.max_tokens is not None else "max_completion_tokens"
    limit = ctx.max_tokens_limit
    if limit is not None and asked > limit:
        raise BadPrompt(f"{name} {asked} exceeds this server's limit of {limit}", param=name,
                        limit=limit)
    context = ctx.loop.engine.max_model_len
    for prompt, sp in zip(prompts, params, strict=True):
        n = len(ctx.loop.engine.encode(prompt) if isinstance(prompt, str) else prompt)
        if n + sp.max_tokens > context:
            raise BadPrompt(f"the prompt's {n} tokens + {name} {sp.max_tokens} exceed the "
                            f"model's context of {context} tokens", param=name,
                            prompt_tokens=n, context=context)


def _default_max_tokens(ctx: ServingContext, prompt: str | list[int], kind: str) -> int:
    """OpenAI's defaults: 16 for completions; chat runs to the context limit."""
    if kind == "text_completion":
        return 16
    room = ctx.loop.engine.max_model_len - (len(prompt) if isinstance(prompt, list) else 0)
    return max(1, room)
