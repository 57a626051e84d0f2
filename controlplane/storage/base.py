"""The object-store interface and its content-addressed blob layer.

Blobs live at `blobs/sha256/<hex>` where hex is the SHA-256 of their bytes, so every
read can be checked against its own key. A blob whose key exists is trusted only after
it verifies (`blob_fault`: size, then a digest of the stored bytes); one that does not
is overwritten by the next `put_blob` of the right bytes, atomically. Data always moves
through files on local disk in fixed-size chunks; no method holds a whole object in
memory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

CHUNK_BYTES = 1024 * 1024


class StorageError(Exception):
    """Any object-store failure. `transient` failures may succeed when retried."""

    transient = False


class TransientStorageError(StorageError):
    transient = True


class ObjectNotFound(StorageError):
    pass


class ChecksumMismatch(StorageError):
    """Bytes read back do not hash to the digest they were stored under."""

    def __init__(self, key: str, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch for {key}: expected {expected}, got {actual}")
        self.key, self.expected, self.actual = key, expected, actual


class BlobTooLarge(StorageError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"object exceeds the limit of {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class BlobRef:
    sha256: str
    size: int
    key: str


BLOB_PREFIX = "blobs/sha256/"


@dataclass(frozen=True)
class StoredObject:
    """One object as a listing reports it; `modified_at` is its last write (UTC)."""

    key: str
    size: int
    modified_at: datetime


BlobClaim = Callable[[BlobRef], None]
"""Called by `put_blob` with the blob's reference once its digest is known and before
the store is asked whether the blob is already there (garbage collection's fence:
controlplane/retention)."""


def blob_key(sha256_hex: str) -> str:
    return f"{BLOB_PREFIX}{sha256_hex}"


class ObjectStore(ABC):
    """Keys are relative, `/`-separated paths; implementations map them to a backend."""

    url: str

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store the file at `path` under `key` (atomic: readers never see a partial object)."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> None:
        """Write the object `key` to `dest`; `ObjectNotFound` when absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size_of(self, key: str) -> int | None:
        """Size in bytes of the object `key`, None when absent (a stat or a HEAD)."""

    def stored_sha256(self, key: str) -> str:
        """SHA-256 hex of the stored bytes of `key`, read back in full (a download into a
        temp file here; the file store hashes in place). `ObjectNotFound` when absent."""
        fd, tmp_name = tempfile.mkstemp(prefix="adapterplane-verify-")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            self.get_file(key, tmp)
            return file_sha256(tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def blob_fault(self, sha256: str, size: int, key: str | None = None) -> str | None:
        """None when the blob stored under `key` (default `blob_key(sha256)`) has exactly
        `size` bytes hashing to `sha256`; otherwise why not: "missing", "size" or "digest".

        Cost: one size lookup, then (sizes equal) one full read of the stored bytes."""
        key = key or blob_key(sha256)
        stored_size = self.size_of(key)
        if stored_size is None:
            return "missing"
        if stored_size != size:
            return "size"
        try:
            actual = self.stored_sha256(key)
        except ObjectNotFound:
            return "missing"
        return None if actual == sha256 else "digest"

    @abstractmethod
    def check(self) -> None:
        """Raise `StorageError` when the store is unreachable (readiness probe)."""

    @abstractmethod
    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        """Every object whose key starts with `prefix`, in no particular order (a
        directory walk or a paginated S3 listing; read lazily)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object `key`; an absent one is not an error."""

    def put_blob(self, stream: IO[bytes], *, max_bytes: int | None = None,
                 claim: BlobClaim | None = None) -> BlobRef:
        """Hash `stream` to a temp file, store it under its digest, return the reference.

        An object already under that key is kept only if it verifies (`blob_fault`: one
        read-back of it); a corrupt or truncated one is replaced by these bytes. Raises
        `BlobTooLarge` as soon as more than `max_bytes` were read. `claim(ref)` runs
        after hashing and before the store is consulted (see `BlobClaim`).
        """
        digest = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(prefix="adapterplane-blob-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK_BYTES):
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise BlobTooLarge(max_bytes)
                    digest.update(chunk)
                    out.write(chunk)
            ref = BlobRef(sha256=digest.hexdigest(), size=size, key=blob_key(digest.hexdigest()))
            if claim is not None:
                claim(ref)
            if self.blob_fault(ref.sha256, ref.size, ref.key) is not None:
                self.put_file(ref.key, tmp)
            return ref
        finally:
            tmp.unlink(missing_ok=True)

    def put_blob_bytes(self, data: bytes, *, claim: BlobClaim | None = None) -> BlobRef:
        """Small metadata objects (manifests) only."""
        import io

        return self.put_blob(io.BytesIO(data), claim=claim)

    def get_blob(self, key: str, dest: Path, *, expected_sha256: str) -> None:
        """Download `key` to `dest` and verify its SHA-256; `ChecksumMismatch` otherwise.

        On mismatch `dest` is removed, so a corrupt copy is never left behind.
        """
        self.get_file(key, dest)
        actual = file_sha256(dest)
        if actual != expected_sha256:
            dest.unlink(missing_ok=True)
            raise ChecksumMismatch(key, expected_sha256, actual)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
