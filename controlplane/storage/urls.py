"""Read URLs for stored objects: a `file://` path, or a presigned S3 GET valid URL_TTL_S.

A presigned URL is a bearer credential until it expires, so it lives only as long as a
download needs: readers (agents) refresh their desired state every `url_ttl_s / 2`, so
a URL they start a download on has at least half its lifetime left. Its signature is
redacted from every log line (kit/log_redaction.py).
"""

from __future__ import annotations

from controlplane.errors import NotFound
from controlplane.storage.base import ObjectStore
from controlplane.storage.file_store import FileObjectStore
from controlplane.storage.s3_store import S3ObjectStore

URL_TTL_S = 300
"""Seconds a presigned GET stays valid (sent to readers as `url_ttl_s`)."""


def object_url(store: ObjectStore, key: str) -> str:
    """A URL a reader can fetch `key` from: file:// path or a presigned S3 GET."""
    if isinstance(store, FileObjectStore):
        return (store.root / key).as_uri()
    if isinstance(store, S3ObjectStore):
        full = f"{store.prefix}/{key}" if store.prefix else key
        url: str = store.client.generate_presigned_url(
            "get_object", Params={"Bucket": store.bucket, "Key": full}, ExpiresIn=URL_TTL_S)
        return url
    raise NotFound("the object store cannot hand out URLs", detail={"store": store.url})
