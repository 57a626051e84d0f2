"""Which object-store keys the registry's rows reference.

Every row that owns stored bytes names them the same way: a manifest key `storage_key`
and `files = {name: {"sha256", "size", "key"}}` (artifacts, fitted collections, merged
releases). The referencing models are found from the ORM registry by those two columns
(`blob_owners`), so a new kind of row that stores blobs is protected from garbage
collection without a change here. Both columns are immutable once written, so a key
referenced once stays referenced for as long as its row lives (an artifact row can be
deleted: controlplane/artifacts/deletion.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Text, cast, or_, select
from sqlalchemy.orm import Session

from controlplane.models import Base

OWNER_COLUMNS = frozenset({"id", "storage_key", "files"})


@cache
def blob_owners() -> tuple[Any, ...]:
    """The mapped classes with `storage_key` and `files` columns, by table name."""
    owners = [mapper.class_ for mapper in Base.registry.mappers
              if set(mapper.columns.keys()) >= OWNER_COLUMNS]
    return tuple(sorted(owners, key=lambda cls: cls.__tablename__))


def referenced_keys(session: Session) -> set[str]:
    """Every key any row references (one streamed read of both tables)."""
    keys: set[str] = set()
    for model in blob_owners():
        rows = session.execute(select(model.storage_key, model.files)
                               .execution_options(yield_per=500))
        for storage_key, files in rows:
            if storage_key:
                keys.add(storage_key)
            keys.update(_file_keys(files))
    return keys


def is_referenced(session: Session, key: str) -> bool:
    """Whether any row references `key`, read inside the caller's transaction. A row
    whose files merely mention the key's digest counts too (conservative: it only ever
    keeps a blob)."""
    digest = key.rsplit("/", 1)[-1]
    for model in blob_owners():
        hit = session.scalar(select(model.id).where(or_(
            model.storage_key == key, cast(model.files, Text).contains(digest))).limit(1))
        if hit is not None:
            return True
    return False


def _file_keys(files: Any) -> list[str]:
    if not isinstance(files, dict):
        return []
    return [str(ref["key"]) for ref in files.values() if isinstance(ref, dict) and "key" in ref]
