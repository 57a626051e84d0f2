"""Request body limits, enforced while the body streams in (pure ASGI middleware).

Every body is capped, chunked or not: a declared `Content-Length` over the cap is
refused before anything is read, and a body that grows past it is not read past the
chunk that crosses it.

- Uploads (POST to a path `upload_path` matches) are streamed by their route, never
  buffered: the route's `receive` counts bytes and raises `ArtifactTooLarge` (multipart,
  cap `max_upload_bytes`) or `RequestTooLarge` (any other body, cap `max_body_bytes`) as
  soon as the count passes the cap; the app's error handler answers it.
- Bodies of GET/HEAD/OPTIONS are never read by any route; they are counted the same way.
- Every other body is read here, up to `max_body_bytes` (413 REQUEST_TOO_LARGE answered
  here, the app never runs), and replayed to the app, so no route sees a partial body.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.errors import AdapterplaneError, ArtifactTooLarge, RequestTooLarge
from controlplane.kit.failures import domain_error_response

BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyLimitMiddleware:
    """Caps request bodies (see module doc)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int,
                 upload_path: re.Pattern[str]) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_path = upload_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        streamed = scope["method"] in BODYLESS_METHODS or (
            scope["method"] == "POST" and self.upload_path.fullmatch(scope["path"]) is not None)
        too_large = self._too_large(headers, streamed)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > too_large.detail["limit_bytes"]:
            too_large.detail["content_length"] = int(declared)
            await domain_error_response(too_large)(scope, receive, send)
            return
        if streamed:
            await self.app(scope, _counting(receive, too_large), send)
            return
        try:
            replay = await _read_all(receive, too_large)
        except AdapterplaneError as exc:
            await domain_error_response(exc)(scope, receive, send)
            return
        await self.app(scope, replay, send)

    def _too_large(self, headers: Headers, streamed: bool) -> AdapterplaneError:
        if streamed and headers.get("content-type", "").startswith("multipart/form-data"):
            return ArtifactTooLarge(f"artifact upload exceeds {self.max_upload_bytes} bytes",
                                    detail={"limit_bytes": self.max_upload_bytes})
        return RequestTooLarge(f"request body exceeds {self.max_body_bytes} bytes",
                               detail={"limit_bytes": self.max_body_bytes})


def _counting(receive: Receive, too_large: AdapterplaneError) -> Receive:
    limit: int = too_large.detail["limit_bytes"]
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large
        return message

    return counted


async def _read_all(receive: Receive, too_large: AdapterplaneError) -> Receive:
    """Read the whole body (raising `too_large` past its limit); return a `receive` that
    replays it as one message, then hands on to the connection's (disconnects)."""
    limit: int = too_large.detail["limit_bytes"]
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: let the app see it
            pending: Message | None = message
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            pending = None
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            if pending is not None:
                return pending
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
