"""The one error body as an HTTP response, and which database failures mean "retry".

Used by the app's exception handlers and by the middlewares that answer before the app
runs (the auth gate, the body limits), so every error response has the same shape.
"""

from __future__ import annotations

from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from controlplane.errors import AdapterplaneError, DatabaseUnavailable, ErrorBody

DATABASE_DOWN = (OperationalError, InterfaceError, PoolTimeout)
"""SQLAlchemy errors of an unreachable database: refused or dropped connections (the
driver's OperationalError/InterfaceError) and a pool that had no connection in time."""


def error_response(status_code: int, body: ErrorBody,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    content = {"error": body.error, "code": body.code, "detail": body.detail}
    return JSONResponse(jsonable_encoder(printable(content)), status_code=status_code,
                        headers=headers)


def domain_error_response(exc: AdapterplaneError) -> JSONResponse:
    headers = None
    if isinstance(exc, DatabaseUnavailable):
        headers = {"Retry-After": str(exc.retry_after_s)}
    return error_response(exc.status_code, exc.body(), headers)


def database_unavailable(exc: Exception) -> DatabaseUnavailable:
    """The 503 for a DATABASE_DOWN error: its class only, never the driver's message
    (that names hosts, ports and users)."""
    return DatabaseUnavailable("the database is unavailable; retry later",
                               detail={"reason": type(exc).__name__})


def printable(value: Any) -> Any:
    """Strings and bytes made valid UTF-8: a path may percent-decode to lone surrogates
    and a body may be any bytes; error messages and details echo both back, and no
    JSON encoder can write them as they are."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bytes):  # e.g. pydantic's `input` of an invalid JSON body
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value
