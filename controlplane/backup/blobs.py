"""Moving blobs between an object store and a backup directory, checked both ways.

Out: every referenced blob is downloaded through `ObjectStore.get_blob`, which verifies
its SHA-256; a missing or damaged one fails the backup. In: every file is re-hashed
against the manifest before the first upload (`verify_files`), then uploaded unless the
target already holds a verified copy (content addressing makes that copy the same bytes).
"""

from __future__ import annotations

from pathlib import Path

from controlplane.backup.errors import BackupInvalid, SourceBlobFault
from controlplane.backup.manifest import BlobEntry
from controlplane.backup.references import BlobReference
from controlplane.storage.base import ChecksumMismatch, ObjectNotFound, ObjectStore, blob_key
from controlplane.storage.base import file_sha256 as sha256_of


def copy_out(store: ObjectStore, refs: list[BlobReference], objects_dir: Path
             ) -> list[BlobEntry]:
    entries: list[BlobEntry] = []
    for ref in refs:
        dest = objects_dir / ref.key
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            store.get_blob(ref.key, dest, expected_sha256=ref.sha256)
        except ObjectNotFound as exc:
            raise SourceBlobFault(f"blob {ref.key} is missing from {store.url}; run the "
                                  "backup again", detail={"key": ref.key,
                                                          "fault": "missing"}) from exc
        except ChecksumMismatch as exc:
            raise SourceBlobFault(f"blob {ref.key} in {store.url} does not match its digest",
                                  detail={"key": ref.key, "fault": "digest"}) from exc
        size = dest.stat().st_size
        if ref.size is not None and size != ref.size:
            raise SourceBlobFault(f"blob {ref.key} has {size} bytes, the catalog says "
                                  f"{ref.size}", detail={"key": ref.key, "fault": "size"})
        entries.append(BlobEntry(key=ref.key, sha256=ref.sha256, size=size))
    return entries


def verify_file(path: Path, sha256: str, size: int, what: str) -> None:
    """`BackupInvalid` unless `path` exists with exactly `size` bytes hashing to `sha256`."""
    if not path.is_file():
        raise BackupInvalid(f"{what} is missing from the backup", detail={"path": str(path)})
    if path.stat().st_size != size:
        raise BackupInvalid(f"{what} has {path.stat().st_size} bytes, the manifest says {size}",
                            detail={"path": str(path), "fault": "size"})
    if sha256_of(path) != sha256:
        raise BackupInvalid(f"{what} does not match its digest in the manifest",
                            detail={"path": str(path), "fault": "digest"})


def verify_files(entries: list[BlobEntry], objects_dir: Path) -> None:
    for entry in entries:
        if entry.key != blob_key(entry.sha256):
            raise BackupInvalid(f"manifest entry {entry.key!r} is not the blob key of its "
                                "digest", detail={"key": entry.key})
        verify_file(objects_dir / entry.key, entry.sha256, entry.size, f"blob {entry.key}")


def copy_in(store: ObjectStore, entries: list[BlobEntry], objects_dir: Path) -> int:
    """Upload what the target lacks (or holds damaged); returns how many were uploaded."""
    uploaded = 0
    for entry in entries:
        if store.blob_fault(entry.sha256, entry.size, entry.key) is None:
            continue
        store.put_file(entry.key, objects_dir / entry.key)
        uploaded += 1
    return uploaded
