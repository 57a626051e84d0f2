"""Build the configured object store from settings."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from controlplane.config import Settings
from controlplane.storage.base import ObjectStore, StorageError
from controlplane.storage.file_store import FileObjectStore


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> ("bucket", "a/b")."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StorageError(f"not an s3:// URI: {uri!r}")
    return parsed.netloc, parsed.path.strip("/")


def file_uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise StorageError(f"not a local file:// URI: {uri!r}")
    return Path(unquote(parsed.path))


def store_from_settings(settings: Settings) -> ObjectStore:
    url = settings.storage_url
    if url.startswith("file://"):
        return FileObjectStore(file_uri_path(url))
    if url.startswith("s3://"):
        from controlplane.storage.s3_store import S3ObjectStore, make_s3_client

        bucket, prefix = split_s3_uri(url)
        return S3ObjectStore(make_s3_client(settings), bucket, prefix,
                             chunk_bytes=settings.s3_multipart_chunk_bytes)
    raise StorageError(f"unsupported storage_url {url!r} (use file:// or s3://)")
