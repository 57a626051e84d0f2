"""Read URLs for stored objects: a `file://` path, or a presigned S3 GET valid URL_TTL_S."""

from __future__ import annotations

from controlplane.errors import NotFound
from controlplane.storage.base import ObjectStore
from controlplane.storage.file_store import FileObjectStore
from controlplane.storage.s3_store import S3ObjectStore

URL_TTL_S = 3600


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
