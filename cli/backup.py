"""`adapterplane backup --out DIR` and `adapterplane restore --from DIR`
(controlplane/backup; docs/OPERATIONS.md, "Backup and restore").

Both read the stack's settings (`ADAPTERPLANE_DATABASE_URL`, `ADAPTERPLANE_STORAGE_URL`,
S3 credentials, ...), `--database-url` overriding the database as for `migrate`. A refusal
prints `error: CODE: message` and exits with the `cli.errors` contract: 2 for a non-empty
`--out` or PostgreSQL client/server versions that do not fit, 4 for a non-empty target
database, 5 for a damaged or foreign backup, 7 for an unreachable or faulty store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.errors import ExitCode

if TYPE_CHECKING:
    from controlplane.config import Settings

EXIT_CODES: dict[str, ExitCode] = {
    "BACKUP_OUT_NOT_EMPTY": ExitCode.USAGE,
    "POSTGRES_VERSION_MISMATCH": ExitCode.USAGE,
    "RESTORE_TARGET_NOT_EMPTY": ExitCode.CONFLICT,
    "BACKUP_INVALID": ExitCode.INVALID,
    "UNKNOWN_SCHEMA_REVISION": ExitCode.INVALID,
    "SOURCE_BLOB_FAULT": ExitCode.UNAVAILABLE,
    "STORAGE_ERROR": ExitCode.UNAVAILABLE,
}
"""Stable: never renumber, only add. Unlisted codes (BACKUP_FAILED) exit 1."""


def _settings(database_url: str | None) -> Settings:
    from controlplane.config import Settings

    settings = Settings()
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return settings


def _fail(code: str, message: str) -> typer.Exit:
    typer.echo(f"error: {code}: {message}", err=True)
    return typer.Exit(int(EXIT_CODES.get(code, ExitCode.INTERNAL)))


def backup_command(
    out: Path = typer.Option(..., "--out", help="New or empty directory for the backup."),
    database_url: str | None = typer.Option(
        None, "--database-url", help="Default: ADAPTERPLANE_DATABASE_URL or the embedded SQLite."
    ),
) -> None:
    """Back up the database (pg_dump / SQLite online backup) and every blob it references,
    with a manifest of sizes and digests; prints the manifest summary as JSON."""
    from controlplane.backup.backup import create_backup
    from controlplane.backup.errors import BackupError
    from controlplane.storage.base import StorageError

    try:
        manifest = create_backup(_settings(database_url), out)
    except BackupError as exc:
        raise _fail(exc.code, exc.message) from exc
    except StorageError as exc:
        raise _fail("STORAGE_ERROR", str(exc)) from exc
    typer.echo(json.dumps({"out": str(out), "schema_revision": manifest.schema_revision,
                           "dialect": manifest.database.dialect,
                           "database_bytes": manifest.database.size,
                           "blobs": len(manifest.blobs),
                           "blob_bytes": sum(b.size for b in manifest.blobs)}))


def restore_command(
    source: Path = typer.Option(..., "--from", help="A directory written by `backup`."),
    database_url: str | None = typer.Option(
        None, "--database-url", help="Default: ADAPTERPLANE_DATABASE_URL or the embedded SQLite."
    ),
) -> None:
    """Restore a backup into an empty database and the configured store, then migrate to
    head; refuses a non-empty database and a damaged backup before writing anything."""
    from controlplane.backup.errors import BackupError
    from controlplane.backup.restore import restore_backup
    from controlplane.storage.base import StorageError

    try:
        report = restore_backup(_settings(database_url), source)
    except BackupError as exc:
        raise _fail(exc.code, exc.message) from exc
    except StorageError as exc:
        raise _fail("STORAGE_ERROR", str(exc)) from exc
    typer.echo(json.dumps({"from": str(source), "schema_revision": report.schema_revision,
                           "head_revision": report.head_revision, "blobs": report.blobs,
                           "uploaded": report.uploaded}))
