"""Typed CLI errors and the stable exit-code contract CI pipelines gate on.

Every failure `adapterctl` reports is a `CliError` carrying a stable `code` (the API's
error code, an artifact rejection code, or a local one such as `USAGE`) and an
`ExitCode`. The mapping is part of the public interface: never renumber, only add.

Codes are printed upper-case, whatever their source: the API's artifact and collection
rejection codes are lower-case values (`non_finite`, kept as they are in `-o json`
bodies), and `adapterctl` shows them as `NON_FINITE` like every other code.

| exit | meaning | codes |
|---|---|---|
| 0 | success | |
| 1 | unexpected internal error (a bug) | |
| 2 | usage: bad arguments or local input | USAGE, Click usage errors |
| 3 | not found | NOT_FOUND |
| 4 | conflict | GENERATION_CONFLICT, ALREADY_EXISTS, INVALID_STATE |
| 5 | invalid / rejected | VALIDATION_ERROR, BASE_MISMATCH, IDEMPOTENCY_MISMATCH, FORBIDDEN_FILE, |
|   |                    | MISSING_FILE, ARTIFACT_TOO_LARGE, any 4xx without a known code, |
|   |                    | every artifact rejection code (lower-case in the API) |
| 6 | authentication / authorisation | UNAUTHENTICATED, FORBIDDEN |
| 7 | server error or unreachable | STORAGE_ERROR, UNREACHABLE, HTTP 5xx |
| 8 | alias retired | ALIAS_RETIRED |
| 9 | timed out waiting | WAIT_TIMEOUT |
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Process exit status of `adapterctl` (stable; see the module table)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    INVALID = 5
    AUTH = 6
    UNAVAILABLE = 7
    RETIRED = 8
    TIMEOUT = 9


_BY_CODE: dict[str, ExitCode] = {
    "USAGE": ExitCode.USAGE,
    "NOT_FOUND": ExitCode.NOT_FOUND,
    "GENERATION_CONFLICT": ExitCode.CONFLICT,
    "ALREADY_EXISTS": ExitCode.CONFLICT,
    "INVALID_STATE": ExitCode.CONFLICT,
    "VALIDATION_ERROR": ExitCode.INVALID,
    "BASE_MISMATCH": ExitCode.INVALID,
    "IDEMPOTENCY_MISMATCH": ExitCode.INVALID,
    "ARTIFACT_TOO_LARGE": ExitCode.INVALID,
    "ARTIFACT_REJECTED": ExitCode.INVALID,
    "FORBIDDEN_FILE": ExitCode.INVALID,
    "MISSING_FILE": ExitCode.INVALID,
    "UNAUTHENTICATED": ExitCode.AUTH,
    "FORBIDDEN": ExitCode.AUTH,
    "STORAGE_ERROR": ExitCode.UNAVAILABLE,
    "UNREACHABLE": ExitCode.UNAVAILABLE,
    "ALIAS_RETIRED": ExitCode.RETIRED,
    "WAIT_TIMEOUT": ExitCode.TIMEOUT,
}

_BY_STATUS: dict[int, ExitCode] = {
    400: ExitCode.INVALID,
    401: ExitCode.AUTH,
    403: ExitCode.AUTH,
    404: ExitCode.NOT_FOUND,
    409: ExitCode.CONFLICT,
    410: ExitCode.RETIRED,
    413: ExitCode.INVALID,
    422: ExitCode.INVALID,
}


def shown_code(code: str) -> str:
    """`code` as adapterctl prints it: upper case (rejection codes are lower-case in the API)."""
    return code.upper()


def exit_code_for(code: str, status: int | None = None) -> ExitCode:
    """Exit code for an error `code`, falling back on the HTTP `status` for unknown codes.

    Lower-case codes are artifact rejection codes (`dataplane.artifacts.RejectionCode`):
    they all mean "rejected" (5).
    """
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code and code == code.lower():
        return ExitCode.INVALID
    if status is not None:
        if status in _BY_STATUS:
            return _BY_STATUS[status]
        if status >= 500:
            return ExitCode.UNAVAILABLE
        if status >= 400:
            return ExitCode.INVALID
    return ExitCode.INTERNAL


class CliError(Exception):
    """A reportable failure: printed as `error: <CODE>: <message>`, exits `exit_code`.

    `code` is stored upper-cased (`shown_code`); the exit code is derived from the code as
    given, so a lower-case rejection code still exits 5.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        detail: Any = None,
        exit_code: ExitCode | None = None,
    ) -> None:
        super().__init__(f"{shown_code(code)}: {message}")
        self.code = shown_code(code)
        self.message = message
        self.status = status
        self.detail = detail
        self.exit_code = exit_code if exit_code is not None else exit_code_for(code, status)


class ApiError(CliError):
    """The admin API answered with an error body `{error, code, detail}` (or no body)."""


def usage_error(message: str) -> CliError:
    """Bad local input (malformed `NS/ALIAS`, missing file): exit 2, nothing sent."""
    return CliError("USAGE", message, exit_code=ExitCode.USAGE)
