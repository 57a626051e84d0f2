"""Object storage: content-addressed blobs on `file://` or `s3://`.

`store_from_settings(settings)` builds the configured `ObjectStore`;
`import_prefix(uri, ...)` reads a PEFT adapter directory from `s3://` or `file://`.
"""

from __future__ import annotations

from controlplane.storage.base import (
    BLOB_PREFIX,
    BlobClaim,
    BlobRef,
    BlobTooLarge,
    ChecksumMismatch,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StoredObject,
    TransientStorageError,
    blob_key,
)
from controlplane.storage.factory import store_from_settings
from controlplane.storage.importing import ADAPTER_FILES, import_prefix

__all__ = [
    "ADAPTER_FILES",
    "BLOB_PREFIX",
    "BlobClaim",
    "BlobRef",
    "BlobTooLarge",
    "ChecksumMismatch",
    "ObjectNotFound",
    "ObjectStore",
    "StorageError",
    "StoredObject",
    "TransientStorageError",
    "blob_key",
    "import_prefix",
    "store_from_settings",
]
