"""`create_backup`: the database first, then the blobs it references, then the manifest.

Why this order is consistent: blobs are content-addressed and never rewritten, and every
row that names a blob is committed only after the blob is in the store (a push stores its
files and manifest before inserting the artifact row; a fit stores its bundle before
recording it). So every blob the snapshot references existed when the snapshot was taken,
and copying afterwards finds the same bytes (each copy is checked against its digest).
Blobs written after the snapshot are simply not referenced by it and not copied. The one
way a referenced blob can vanish is garbage collection after the snapshot removed its
rows; the copy then fails with `SOURCE_BLOB_FAULT` and the backup is run again.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from controlplane.backup import postgres, sqlite
from controlplane.backup.blobs import copy_out
from controlplane.backup.errors import BackupError, OutputNotEmpty
from controlplane.backup.manifest import (
    OBJECTS_DIR,
    BackupManifest,
    DatabaseEntry,
    write_manifest,
)
from controlplane.backup.references import BlobReference, referenced_blobs
from controlplane.config import Settings
from controlplane.db import make_engine
from controlplane.storage.base import file_sha256
from controlplane.storage.factory import store_from_settings

PG_DUMP_FILE = "database.pgdump"
SQLITE_FILE = "database.sqlite"


def create_backup(settings: Settings, out: Path) -> BackupManifest:
    """Write a complete backup of `settings`' database and store into the empty (or new)
    directory `out`; on failure `out` is emptied again (no manifest: never a backup)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputNotEmpty(f"{out} exists and is not an empty directory",
                             detail={"path": str(out)})
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _write(settings, out)
    except BaseException:
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _write(settings: Settings, out: Path) -> BackupManifest:
    store = store_from_settings(settings)
    store.check()
    url = settings.database_url
    taken_at = datetime.now(UTC)
    if make_url(url).get_backend_name() == "postgresql":
        with postgres.exported_snapshot(url) as (conn, snapshot):
            server_num = postgres.server_version_num(conn)
            revision = _revision(conn)
            info = postgres.dump(url, snapshot, server_num, out / PG_DUMP_FILE)
            refs = referenced_blobs(conn)
        database = _entry(out / PG_DUMP_FILE, "postgresql",
                          server_version_num=info.server_version_num,
                          dump_tool_major=info.dump_tool_major)
    else:
        sqlite.snapshot(url, out / SQLITE_FILE)
        revision, refs = _read_copy(out / SQLITE_FILE)
        database = _entry(out / SQLITE_FILE, "sqlite")
    blobs = copy_out(store, refs, out / OBJECTS_DIR)
    manifest = BackupManifest(created_at=taken_at, schema_revision=revision,
                              source_storage_url=store.url, database=database, blobs=blobs)
    write_manifest(out, manifest)
    return manifest


def _revision(conn: Connection) -> str:
    revision = MigrationContext.configure(conn).get_current_revision()
    if revision is None:
        raise BackupError("the database has no schema revision (run `adapterplane migrate`)")
    return revision


def _read_copy(copy: Path) -> tuple[str, list[BlobReference]]:
    engine = make_engine(f"sqlite:///{copy}", pool_size=1)
    try:
        with engine.connect() as conn:
            return _revision(conn), referenced_blobs(conn)
    finally:
        engine.dispose()


def _entry(path: Path, dialect: str, **versions: int) -> DatabaseEntry:
    return DatabaseEntry.model_validate({"dialect": dialect, "file": path.name,
                                         "sha256": file_sha256(path),
                                         "size": path.stat().st_size, **versions})
