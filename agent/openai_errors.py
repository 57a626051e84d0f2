"""OpenAI's error object for every refusal of the agent's inference API.

    {"error": {"message": str, "type": str, "param": str | None, "code": str,
               "detail": {...}}}

`code` is the product's stable code (docs/API.md, "Error codes"); `type` is OpenAI's class
of the error, by HTTP status, so OpenAI clients raise the matching exception and expose
`code`, `param` and `type`; `detail` is the product's structured context (an extension
OpenAI clients ignore).
"""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "invalid_request_error",
               409: "invalid_request_error", 410: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def error_type(status: int) -> str:
    """OpenAI's error type for an HTTP status (5xx: server_error)."""
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, code: str, message: str, *, param: str | None = None,
               detail: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one refusal."""
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code, "detail": detail or {}}}
