"""Authenticate before the body (pure ASGI middleware).

A request that may carry a body (any method but GET/HEAD/OPTIONS) to any path but the
public ones is authenticated from its headers alone, before a byte of its body is read:
without a valid bearer token it gets its 401 at once, so an anonymous caller cannot make
the API receive, buffer or parse anything. The principal is handed to the route in the
request's state (auth/dependencies.py), so the token is looked up once.

GET/HEAD/OPTIONS are left to their routes (no route reads their bodies): the resolve hot
path keeps its single authenticate-and-resolve statement.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.auth.dependencies import PRINCIPAL_STATE, authenticate_token, bearer_from_header
from controlplane.errors import AdapterplaneError
from controlplane.kit.body_limit import BODYLESS_METHODS
from controlplane.kit.failures import DATABASE_DOWN, database_unavailable, domain_error_response

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc"})


class AuthGateMiddleware:
    """401 before the body for requests without a valid token (see module doc).

    `self_authenticated_prefix`: a path tree that authenticates its own requests (the
    web console at `/ui`, whose session cookie holds the token and is checked with the
    same `authenticate_token` before any form is read)."""

    def __init__(self, app: ASGIApp, self_authenticated_prefix: str | None = None) -> None:
        self.app = app
        self.own_prefix = self_authenticated_prefix

    def _self_authenticated(self, path: str) -> bool:
        return self.own_prefix is not None and (
            path == self.own_prefix or path.startswith(self.own_prefix + "/"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] in BODYLESS_METHODS
                or scope["path"] in PUBLIC_PATHS or self._self_authenticated(scope["path"])):
            await self.app(scope, receive, send)
            return
        try:
            token = bearer_from_header(Headers(scope=scope).get("authorization"))
            principal = await run_in_threadpool(
                authenticate_token, scope["app"].state.read_engine, token)
        except AdapterplaneError as exc:
            await domain_error_response(exc)(scope, receive, send)
            return
        except DATABASE_DOWN as exc:
            await domain_error_response(database_unavailable(exc))(scope, receive, send)
            return
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal
        await self.app(scope, receive, send)
