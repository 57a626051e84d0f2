"""Structured JSON request logging with a request id (structlog).

`RequestLogMiddleware` (pure ASGI, so it adds no task or body copy per request):

- takes the caller's `X-Request-ID` when it is 1..64 chars of `[A-Za-z0-9._-]`,
  otherwise makes a fresh one (uuid4 hex); echoes it in the response header;
- binds it into structlog's contextvars for the request, so every log line emitted
  while serving it (service code, error handlers) carries `request_id`;
- logs one `request` event when the response starts: method, path (never the query
  string), status, duration in ms;
- is the last line of defence: an exception that escaped every handler is logged as
  `request.failed` with its traceback and answered with the one error body,
  500 `{"error", "code": "INTERNAL_ERROR", "detail": {"request_id"}}` (if no response
  had started), so clients can quote the id and operators can find the traceback.

Secrets never reach a log line: headers are not logged at all, and the
`redact_secrets` processor masks any value that looks like an API token (`ap_...`),
any key named like a credential and the signature of any presigned URL, whatever code
logs it.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import structlog
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.errors import ErrorBody
from controlplane.kit.log_redaction import REDACTED, install_log_redaction, redact_url_secrets

REQUEST_ID_HEADER = b"x-request-id"
_VALID_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")
_TOKEN = re.compile(r"(?<![A-Za-z0-9])ap_[A-Za-z0-9_-]{20,}")
_SECRET_KEYS = ("token", "authorization", "secret", "password", "credential")

log = structlog.get_logger("adapterplane.api")


def redact_secrets(_logger: Any, _method: str,
                   event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: mask credential-named keys, token-shaped strings and the
    signatures of presigned URLs."""
    for key, value in list(event.items()):
        if any(word in key.lower() for word in _SECRET_KEYS):
            event[key] = REDACTED
        elif isinstance(value, str):
            if "ap_" in value:
                value = _TOKEN.sub(REDACTED, value)
            event[key] = redact_url_secrets(value)
    return event


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr: timestamp (UTC, ISO 8601), level, event, context.

    Idempotent; the last call wins. Loggers are not cached, so
    `structlog.testing.capture_logs()` works in tests. Installs the process-wide
    redaction of presigned URLs in stdlib log records (kit/log_redaction.py).
    """
    install_log_redaction()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*_args: Any) -> structlog.WriteLogger:
    return structlog.WriteLogger(sys.stderr)  # whatever sys.stderr is now


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER and _VALID_ID.fullmatch(value):
            return str(value.decode())
    return uuid.uuid4().hex


class RequestLogMiddleware:
    """One log line per HTTP request, tagged with its request id (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        started = time.perf_counter()
        fields = {"method": scope["method"], "path": scope["path"]}

        started_response = False

        async def send_with_id(message: Message) -> None:
            nonlocal started_response
            if message["type"] == "http.response.start":
                started_response = True
                message["headers"] = [*message.get("headers", ()),
                                      (REQUEST_ID_HEADER, request_id.encode())]
                log.info("request", **fields, status=message["status"],
                         duration_ms=_ms_since(started))
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                log.exception("request.failed", **fields, duration_ms=_ms_since(started))
                if started_response:
                    raise
                body = ErrorBody(error="internal server error", code="INTERNAL_ERROR",
                                 detail={"request_id": request_id})
                await JSONResponse(body.model_dump(), status_code=500)(
                    scope, receive, send_with_id)


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
