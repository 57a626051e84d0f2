"""Authenticate inference requests before their body (pure ASGI middleware).

A POST to the agent (completions, chat) is authenticated from its headers alone before a
byte of its body is read or parsed: a missing, unknown or revoked token gets its 401 at
once, and a control plane that cannot answer (with no recent cached answer for the
token) gets 503 `CONTROL_PLANE_UNAVAILABLE`. The check asks whether the token may read
`*`, which answers 401 for a bad token whatever its scopes (the per-namespace read check
of the alias happens at admission, both cached per token by the control-plane client).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agent.openai_errors import error_body
from agent.sync import ControlPlaneError

Status = Callable[[str], Awaitable[int]]
"""token -> HTTP status of its read check on `*` (raises ControlPlaneError)."""


def control_plane_unavailable(retry_after_s: int) -> JSONResponse:
    return JSONResponse(error_body(
        503, "CONTROL_PLANE_UNAVAILABLE",
        "the control plane cannot be reached to check this token; retry shortly",
        detail={"retry_after_s": retry_after_s}), status_code=503,
        headers={"Retry-After": str(retry_after_s)})


class AuthGate:
    def __init__(self, app: ASGIApp, status: Status, retry_after_s: int) -> None:
        self.app, self.status, self.retry_after_s = app, status, retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scheme, _, token = (Headers(scope=scope).get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            refusal = JSONResponse(error_body(401, "UNAUTHENTICATED", "missing bearer token"),
                                   status_code=401)
            await refusal(scope, receive, send)
            return
        try:
            status = await self.status(token.strip())
        except ControlPlaneError:
            await control_plane_unavailable(self.retry_after_s)(scope, receive, send)
            return
        if status == 401:
            refusal = JSONResponse(error_body(401, "UNAUTHENTICATED",
                                              "unknown or revoked token"), status_code=401)
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
