"""`manifest.json`: what a backup directory holds and how to check it.

Written last (temp file + rename), so a directory without a manifest is an interrupted
backup, never mistaken for a complete one. Every file it lists carries its size and
SHA-256; restore checks them all before it writes anything.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from controlplane.backup.errors import BackupInvalid

MANIFEST_NAME = "manifest.json"
OBJECTS_DIR = "objects"
"""Blobs under the backup directory, in the store's own key layout (`blobs/sha256/<hex>`)."""


class BlobEntry(BaseModel):
    key: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class DatabaseEntry(BaseModel):
    dialect: Literal["postgresql", "sqlite"]
    file: str
    """Name of the dump inside the backup directory."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    server_version_num: int | None = None
    """Postgres `server_version_num` of the source (e.g. 150020); None for SQLite."""
    dump_tool_major: int | None = None
    """Major version of the `pg_dump` that wrote the archive; None for SQLite."""


class BackupManifest(BaseModel):
    format_version: Literal[1] = 1
    created_at: datetime
    """When the database snapshot was taken (UTC)."""
    schema_revision: str
    """Alembic revision of the dumped database."""
    source_storage_url: str
    database: DatabaseEntry
    blobs: list[BlobEntry]


def write_manifest(directory: Path, manifest: BackupManifest) -> Path:
    target = directory / MANIFEST_NAME
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest-")
    with os.fdopen(fd, "w") as handle:
        handle.write(manifest.model_dump_json(indent=2))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    return target


def read_manifest(directory: Path) -> BackupManifest:
    path = directory / MANIFEST_NAME
    try:
        text = path.read_text()
    except OSError as exc:
        raise BackupInvalid(f"no readable {MANIFEST_NAME} in {directory} (an incomplete "
                            "backup?)", detail={"path": str(path)}) from exc
    try:
        return BackupManifest.model_validate_json(text)
    except ValidationError as exc:
        raise BackupInvalid(f"{path} is not a backup manifest",
                            detail={"errors": [f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                               for e in exc.errors()]}) from exc
