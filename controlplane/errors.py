"""One error base class and one JSON error body for the whole API.

Every error response is `{"error": str, "code": STABLE_CODE, "detail": object}`;
codes are stable (add, never rename) and listed in docs/API.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """The body of every 4xx/5xx response."""

    error: str = Field(description="Human-readable message.")
    code: str = Field(description="Stable machine-readable code, e.g. GENERATION_CONFLICT.")
    detail: dict[str, Any] = Field(default_factory=dict)


class AdapterplaneError(Exception):
    """Base of every error the API turns into an `ErrorBody` response."""

    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = dict(detail or {})

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.message, code=self.code, detail=self.detail)


class Unauthenticated(AdapterplaneError):
    status_code = 401
    code = "UNAUTHENTICATED"


class Forbidden(AdapterplaneError):
    status_code = 403
    code = "FORBIDDEN"


class NotFound(AdapterplaneError):
    status_code = 404
    code = "NOT_FOUND"


class AlreadyExists(AdapterplaneError):
    status_code = 409
    code = "ALREADY_EXISTS"


class InvalidState(AdapterplaneError):
    status_code = 409
    code = "INVALID_STATE"


class GenerationConflict(AdapterplaneError):
    status_code = 409
    code = "GENERATION_CONFLICT"


class ArtifactCorrupt(AdapterplaneError):
    """An artifact's stored bytes no longer match the digests recorded at push (a blob
    is missing, truncated or changed); re-pushing the same files repairs them."""

    status_code = 409
    code = "ARTIFACT_CORRUPT"


class ArtifactReferenced(AdapterplaneError):
    """Delete of an artifact that a catalog generation (current or historical: history
    stays resolvable for rollback) or a collection still names."""

    status_code = 409
    code = "ARTIFACT_REFERENCED"


class AliasRetired(AdapterplaneError):
    status_code = 410
    code = "ALIAS_RETIRED"


class ArtifactTooLarge(AdapterplaneError):
    status_code = 413
    code = "ARTIFACT_TOO_LARGE"


class RequestTooLarge(AdapterplaneError):
    status_code = 413
    code = "REQUEST_TOO_LARGE"


class BadRequest(AdapterplaneError):
    """Well-formed JSON that fails a semantic check (bad cursor, bad ABI record...)."""

    status_code = 422
    code = "VALIDATION_ERROR"


class BaseMismatch(AdapterplaneError):
    status_code = 422
    code = "BASE_MISMATCH"


class AloraUnsupported(AdapterplaneError):
    """An activated LoRA where only always-on adapters can go (a collection's members are
    served on every row of their requests)."""

    status_code = 422
    code = "ALORA_UNSUPPORTED"


class IdempotencyMismatch(AdapterplaneError):
    status_code = 422
    code = "IDEMPOTENCY_MISMATCH"


class ForbiddenFile(AdapterplaneError):
    """A pushed artifact contains a file we never read (pickle `.bin` weights)."""

    status_code = 422
    code = "FORBIDDEN_FILE"


class MissingFile(AdapterplaneError):
    status_code = 422
    code = "MISSING_FILE"


class StorageUnavailable(AdapterplaneError):
    status_code = 502
    code = "STORAGE_ERROR"


class ImportSourceUnavailable(AdapterplaneError):
    """A `file://` import names a directory that is missing, outside the allowed roots, or
    reached through a symlink: one answer for all three, so it tells nothing about the
    server's disk."""

    status_code = 422
    code = "IMPORT_SOURCE_UNAVAILABLE"


class DatabaseUnavailable(AdapterplaneError):
    """The database cannot be reached (refused, dropped, pool exhausted); retry later."""

    status_code = 503
    code = "DATABASE_UNAVAILABLE"
    retry_after_s: ClassVar[int] = 5


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (401, "Missing or unknown bearer token (UNAUTHENTICATED)."),
        (403, "The token lacks the needed scope (FORBIDDEN)."),
        (404, "Not found (NOT_FOUND)."),
        (409, "Conflict (GENERATION_CONFLICT, ALREADY_EXISTS, INVALID_STATE, "
               "ARTIFACT_CORRUPT, ARTIFACT_REFERENCED)."),
        (422, "Invalid input (VALIDATION_ERROR, BASE_MISMATCH, IDEMPOTENCY_MISMATCH...)."),
        (503, "The database is unreachable (DATABASE_UNAVAILABLE); retry after `Retry-After` "
              "seconds."),
    )
}
