"""Typed failures of backup and restore; each carries a stable UPPER_CASE code.

Every check that can refuse runs before anything is written, so a refused backup or
restore leaves the source, the target database and the target bucket as they were.
"""

from __future__ import annotations

from typing import Any, ClassVar


class BackupError(Exception):
    """Base: `code` is stable (add, never rename); `detail` is JSON-ready."""

    code: ClassVar[str] = "BACKUP_FAILED"

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = dict(detail or {})


class OutputNotEmpty(BackupError):
    """`backup --out DIR` names a directory that already has files in it."""

    code = "BACKUP_OUT_NOT_EMPTY"


class ToolVersionMismatch(BackupError):
    """`pg_dump`/`pg_restore` is missing, or older than the server or the dump it reads,
    or the target server is older than the one the dump came from."""

    code = "POSTGRES_VERSION_MISMATCH"


class SourceBlobFault(BackupError):
    """A blob the dumped catalog references is absent from the source store (e.g.
    collected after the snapshot: run the backup again) or its bytes do not match its
    digest (a damaged store)."""

    code = "SOURCE_BLOB_FAULT"


class BackupInvalid(BackupError):
    """The backup directory is incomplete or damaged: no or unreadable manifest, a file
    whose size or digest differs from the manifest, a dialect the target cannot take."""

    code = "BACKUP_INVALID"


class UnknownRevision(BackupError):
    """The backup's schema revision is not one of this release's migrations (a backup
    from a newer release)."""

    code = "UNKNOWN_SCHEMA_REVISION"


class TargetNotEmpty(BackupError):
    """The restore target database already holds tables."""

    code = "RESTORE_TARGET_NOT_EMPTY"
