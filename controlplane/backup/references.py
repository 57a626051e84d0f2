"""The blobs a catalog references: what a backup must carry for its dump to be whole.

Read on the same snapshot as the dump (the Postgres exporting transaction, or the SQLite
copy itself), so the list is exactly the dumped rows' blobs. The rows that name blobs are
the ones blob GC protects (`controlplane.retention.references.blob_owners`: artifacts,
fitted collections, merged releases): a manifest blob (`storage_key`) and one blob per
file (`files`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from controlplane.backup.errors import BackupError
from controlplane.retention.references import blob_owners

_BLOB_KEY = re.compile(r"^blobs/sha256/([0-9a-f]{64})$")


@dataclass(frozen=True)
class BlobReference:
    key: str
    sha256: str
    size: int | None
    """Recorded size; None for manifest blobs (their rows keep only the key)."""


def referenced_blobs(conn: Connection) -> list[BlobReference]:
    """Every blob a row names, once, sorted by key."""
    found: dict[str, BlobReference] = {}
    for model in blob_owners():
        for storage_key, files in conn.execute(select(model.storage_key, model.files)):
            if storage_key is not None:
                _add(found, _from_key(storage_key))
            for entry in (files or {}).values():
                _add(found, _from_file_entry(entry))
    return [found[k] for k in sorted(found)]


def _from_key(key: str) -> BlobReference:
    match = _BLOB_KEY.match(key)
    if match is None:
        raise BackupError(f"catalog names an object outside the blob layout: {key!r}",
                            detail={"key": key})
    return BlobReference(key=key, sha256=match.group(1), size=None)


def _from_file_entry(entry: dict[str, Any]) -> BlobReference:
    ref = _from_key(str(entry["key"]))
    if ref.sha256 != entry["sha256"]:
        raise BackupError("catalog file entry's key and digest disagree",
                            detail={"key": ref.key, "sha256": entry["sha256"]})
    return BlobReference(key=ref.key, sha256=ref.sha256, size=int(entry["size"]))


def _add(found: dict[str, BlobReference], ref: BlobReference) -> None:
    known = found.get(ref.key)
    if known is None or known.size is None:
        found[ref.key] = ref
