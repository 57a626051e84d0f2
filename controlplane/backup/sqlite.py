"""SQLite side of backup and restore: the online backup API, both ways.

`sqlite3.Connection.backup` copies a consistent snapshot page by page while writers go on
(the embedded stack need not stop); the copy is then an ordinary database file, so blob
references are read from the copy itself, the very state that was saved.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from controlplane.backup.errors import BackupInvalid, TargetNotEmpty
from controlplane.db import normalize_database_url

_USER_TABLES = ("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name LIMIT 5")


def database_path(url: str) -> Path:
    database = normalize_database_url(url).database
    if database in (None, "", ":memory:"):
        raise BackupInvalid("an in-memory SQLite database cannot be backed up or restored",
                            detail={"database": database})
    return Path(str(database)).expanduser()


def copy_database(source: Path, dest: Path) -> None:
    """Snapshot `source` into `dest` with the online backup API."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(dest)) as dst:
        src.backup(dst)


def snapshot(url: str, dest: Path) -> None:
    source = database_path(url)
    if not source.is_file():
        raise BackupInvalid(f"no SQLite database at {source}", detail={"path": str(source)})
    copy_database(source, dest)


def require_empty(url: str) -> None:
    """Refuse a database file that holds any table; an absent file is empty."""
    path = database_path(url)
    if not path.exists():
        return
    with closing(sqlite3.connect(path)) as conn:
        found = [row[0] for row in conn.execute(_USER_TABLES)]
    if found:
        raise TargetNotEmpty("the target database is not empty; restore needs a fresh one",
                             detail={"relations": found})


def restore(url: str, copy: Path) -> None:
    copy_database(copy, database_path(url))
