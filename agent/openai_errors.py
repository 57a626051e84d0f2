"""OpenAI's error object for every refusal of the agent's inference API.

    {"error": {"message": str, "type": str, "param": str | None, "code": str,
               "detail": {...}}}

`code` is the product's stable code (docs/API.md, "Error codes"); `type` is OpenAI's class
of the error, by HTTP status, so OpenAI clients raise the matching exception and expose
`code`, `param` and `type`; `detail` is the product's structured context (an extension
OpenAI clients ignore).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from agent.catalog import ServingError

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "invalid_request_error",
               409: "invalid_request_error", 410: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def error_type(status: int) -> str:
    """OpenAI's error type for an HTTP status (5xx: server_error)."""
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_response(exc: ServingError) -> JSONResponse:
    """A refusal as OpenAI's error object; one that says when to retry (429 overloaded,
    503 queue timeout, no agent available) carries it as `Retry-After` too."""
    retry = exc.detail.get("retry_after_s")
    param = exc.detail.get("param")
    return JSONResponse(error_body(exc.status, exc.code, exc.message,
                                   param=param if isinstance(param, str) else None,
                                   detail=exc.detail), status_code=exc.status,
                        headers=None if retry is None else {"Retry-After": str(retry)})


def error_body(status: int, code: str, message: str, *, param: str | None = None,
               detail: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one refusal."""
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code, "detail": detail or {}}}


class ErrorObject(BaseModel):
    message: str
    type: str = Field(description="OpenAI's class of the error (by HTTP status).")
    param: str | None = Field(description="The offending request field, where there is one.")
    code: str = Field(description="The product's stable code (docs/API.md).")
    detail: dict[str, Any] = Field(description="Structured context of the refusal.")


class ErrorResponse(BaseModel):
    """The body of every refusal of the agent's API."""

    error: ErrorObject


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (401, "Missing, unknown or revoked bearer token."),
        (403, "The token lacks read on the alias's namespace (or on '*')."),
        (404, "Unknown alias or generation."),
        (410, "The alias is retired."),
        (413, "Request too large."),
        (421, "The generation is served by agents of another base model (WRONG_BASE: a "
              "merged release, or an adapter of the source base)."),
        (422, "Invalid or unsupported request (the field is in `param`)."),
        (429, "Overloaded (`Retry-After`)."),
        (503, "Adapter load failed, queue timeout, or the control plane cannot be reached "
              "(`Retry-After`)."),
    )}
"""Documented in the agent's OpenAPI document for its routes."""
