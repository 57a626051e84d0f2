"""`file://` object store: a directory tree, written atomically via rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from controlplane.storage.base import (
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StoredObject,
    file_sha256,
)


class FileObjectStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise StorageError(f"key escapes the store root: {key!r}")
        return path

    def put_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            os.close(fd)
            shutil.copyfile(path, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            raise StorageError(f"cannot write {key}: {exc}") from exc

    def get_file(self, key: str, dest: Path) -> None:
        src = self._path(key)
        try:
            shutil.copyfile(src, dest)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"no object {key}") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size_of(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {key}: {exc}") from exc

    def stored_sha256(self, key: str) -> str:
        """Hashes the stored file where it lies (no copy)."""
        try:
            return file_sha256(self._path(key))
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"no object {key}") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc}") from exc

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"store root unusable: {exc}") from exc
        if not os.access(self.root, os.W_OK):
            raise StorageError(f"store root not writable: {self.root}")

    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        """Walks the directory holding `prefix` (its last `/`); in-flight `.tmp-` files of
        `put_file` are listed like any file, under their own names."""
        directory = prefix.rpartition("/")[0]
        top = self._path(directory) if directory else self.root
        if not top.is_dir():
            return
        try:
            for dirpath, _dirs, names in os.walk(top):
                for name in names:
                    path = Path(dirpath) / name
                    key = path.relative_to(self.root).as_posix()
                    if not key.startswith(prefix):
                        continue
                    try:
                        info = path.stat()
                    except FileNotFoundError:  # removed while we walked
                        continue
                    yield StoredObject(key, info.st_size,
                                       datetime.fromtimestamp(info.st_mtime, UTC))
        except OSError as exc:
            raise StorageError(f"cannot list {prefix}: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete {key}: {exc}") from exc
