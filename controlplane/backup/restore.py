"""`restore_backup`: check everything, upload the blobs, load the database, migrate.

Every refusal happens before the first write: the manifest, the dump's and each blob's
size and digest, the schema revision (it must be one of this release's migrations), the
dialect, the client/server versions and the target's emptiness. Then the blobs go in
first, as in the live system (a blob is in the store before any row names it), and the
database is loaded in one transaction, so an interrupted restore leaves an empty
database to retry into. Last, the restored revision is checked against the manifest and
the schema is migrated to this release's head.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from sqlalchemy.engine import make_url

from controlplane.backup import postgres, sqlite
from controlplane.backup.blobs import copy_in, verify_file, verify_files
from controlplane.backup.errors import BackupInvalid, UnknownRevision
from controlplane.backup.manifest import OBJECTS_DIR, BackupManifest, read_manifest
from controlplane.config import Settings
from controlplane.migrate import alembic_config, current_revision, upgrade_to_head
from controlplane.storage.factory import store_from_settings


@dataclass(frozen=True)
class RestoreReport:
    schema_revision: str
    """The backup's revision (the database is at head afterwards)."""
    head_revision: str
    blobs: int
    uploaded: int
    """Blobs the target store lacked; the rest were already there, verified."""


def restore_backup(settings: Settings, source: Path) -> RestoreReport:
    url = settings.database_url
    manifest = read_manifest(source)
    db = manifest.database
    verify_file(source / db.file, db.sha256, db.size, f"database dump {db.file}")
    verify_files(manifest.blobs, source / OBJECTS_DIR)
    head = _require_known(url, manifest.schema_revision)
    _require_empty_target(url, manifest)
    store = store_from_settings(settings)
    store.check()
    uploaded = copy_in(store, manifest.blobs, source / OBJECTS_DIR)
    if db.dialect == "postgresql":
        postgres.restore(url, source / db.file)
    else:
        sqlite.restore(url, source / db.file)
    restored = current_revision(url)
    if restored != manifest.schema_revision:
        raise BackupInvalid(f"the restored database is at {restored}, the manifest says "
                            f"{manifest.schema_revision}",
                            detail={"restored": restored, "manifest": manifest.schema_revision})
    upgrade_to_head(url)
    return RestoreReport(schema_revision=manifest.schema_revision, head_revision=head,
                         blobs=len(manifest.blobs), uploaded=uploaded)


def _require_known(url: str, revision: str) -> str:
    """The revision must be one of this release's migrations; returns the head."""
    scripts = ScriptDirectory.from_config(alembic_config(url))
    try:
        known = scripts.get_revision(revision)
    except RevisionError as exc:
        known = None
        cause: Exception | None = exc
    else:
        cause = None
    if known is None:
        raise UnknownRevision(f"schema revision {revision!r} is not one of this release's "
                              "migrations (a backup from a newer release?)",
                              detail={"revision": revision}) from cause
    return str(scripts.get_current_head())


def _require_empty_target(url: str, manifest: BackupManifest) -> None:
    dialect = make_url(url).get_backend_name()
    if dialect != manifest.database.dialect:
        raise BackupInvalid(f"a {manifest.database.dialect} backup cannot be restored into "
                            f"a {dialect} database",
                            detail={"backup": manifest.database.dialect, "target": dialect})
    if dialect == "sqlite":
        sqlite.require_empty(url)
        return
    target_num = postgres.require_empty(url)
    db = manifest.database
    postgres.check_restorable(db.dump_tool_major or 0, db.server_version_num or 0, target_num)
