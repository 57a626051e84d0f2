"""Backup and restore of a whole control plane: the database plus the blobs it names.

A backup directory holds `manifest.json` (`manifest.py`), the database (`pg_dump
--format=custom` for Postgres, an SQLite online-backup copy for the embedded default)
and `objects/`, a copy of every blob the dumped catalog references, in the store's own
layout. `create_backup` (`backup.py`) writes one; `restore_backup` (`restore.py`) loads one
into an empty database and any bucket. Both are offline operator commands (`adapterplane
backup` / `adapterplane restore`) and write no audit entry: the restored audit log is the
backed-up one, entry for entry.
"""
