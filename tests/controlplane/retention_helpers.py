"""Shared pieces of the retention tests: independent blob keys of an adapter directory,
backdating file-store blobs, and object stores that pause at one step so a test can
place a concurrent push or GC pass exactly there."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import session_scope
from controlplane.models import BlobLease, utcnow
from controlplane.storage.file_store import FileObjectStore

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DAY_S = 24 * 3600


def file_blob_key(path: Path) -> str:
    """`blobs/sha256/<hex>` of the file at `path`, hashed here with hashlib."""
    return f"blobs/sha256/{hashlib.sha256(path.read_bytes()).hexdigest()}"


def file_blob_keys(adapter: Path) -> set[str]:
    return {file_blob_key(adapter / n) for n in ADAPTER_FILES}


def blob_keys_of(artifact: dict[str, object]) -> set[str]:
    files = artifact["files"]
    assert isinstance(files, dict)
    return {str(artifact["storage_key"]), *(str(f["key"]) for f in files.values())}


def backdate(store: FileObjectStore, keys: set[str], age_s: float = 2 * DAY_S) -> None:
    stamp = time.time() - age_s
    for key in keys:
        os.utime(store.root / key, (stamp, stamp))


def age_leases(factory: sessionmaker[Session], age_s: float = 2 * DAY_S) -> None:
    """Every lease taken as long ago as `age_s` (the pushes that took them are over)."""
    with session_scope(factory) as session:
        session.execute(update(BlobLease).values(
            leased_at=utcnow() - timedelta(seconds=age_s)))
        session.commit()


def stored_keys(store: FileObjectStore) -> set[str]:
    return {o.key for o in store.list_objects("blobs/sha256/")}


class PausingStore(FileObjectStore):
    """A real file store that, once armed, stops in `delete` (GC's removal, inside its
    transaction) or in `stored_sha256` (a push's check of a blob already there, after
    its lease) until the test releases it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.pause_delete = False
        self.pause_check_of: str | None = None
        self.entered = threading.Event()
        self.release = threading.Event()

    def _pause(self) -> None:
        self.entered.set()
        assert self.release.wait(30), "never released"

    def delete(self, key: str) -> None:
        if self.pause_delete:
            self.pause_delete = False
            self._pause()
        super().delete(key)

    def stored_sha256(self, key: str) -> str:
        if key == self.pause_check_of:
            self.pause_check_of = None
            self._pause()
        return super().stored_sha256(key)
