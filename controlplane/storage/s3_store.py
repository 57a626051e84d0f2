"""`s3://bucket/prefix` object store on boto3.

Retries: botocore's retry modes (`standard` or `adaptive`, `max_attempts` from
settings) handle throttling, 5xx and connection errors inside each call; what still
fails with a connection/throttling/5xx error surfaces as `TransientStorageError` so
callers (Celery jobs) can retry later with backoff. Transfers go through s3transfer
(`upload_file`/`download_file`): streamed, multipart above the chunk size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from controlplane.config import Settings
from controlplane.storage.base import (
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StoredObject,
    TransientStorageError,
)

TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
     "ServiceUnavailable", "503", "500", "502", "504"}
)
NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})


def make_s3_client(settings: Settings) -> Any:
    config = Config(
        region_name=settings.s3_region,
        retries={"mode": settings.s3_retry_mode, "max_attempts": settings.s3_max_attempts},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"} if settings.s3_endpoint_url else None,
    )
    secret = settings.s3_secret_access_key
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret is not None else None,
        config=config,
    )


def translate_error(exc: Exception, what: str) -> StorageError:
    """Map a boto error to our storage errors (transient vs not-found vs other)."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        if code in NOT_FOUND_CODES or status == "404":
            return ObjectNotFound(f"{what}: not found")
        if code in TRANSIENT_CODES or status.startswith("5"):
            return TransientStorageError(f"{what}: {code or status}")
        return StorageError(f"{what}: {code or status}: {exc}")
    if isinstance(exc, BotoConnectionError | HTTPClientError | RetriesExceededError):
        return TransientStorageError(f"{what}: {exc}")
    if isinstance(exc, S3UploadFailedError):  # wraps the ClientError's message only
        return TransientStorageError(f"{what}: {exc}")
    return StorageError(f"{what}: {exc}")


class S3ObjectStore(ObjectStore):
    def __init__(self, client: Any, bucket: str, prefix: str, *, chunk_bytes: int) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.transfer = TransferConfig(
            multipart_threshold=chunk_bytes, multipart_chunksize=chunk_bytes, use_threads=False
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: Path) -> None:
        try:
            self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer)
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            raise translate_error(exc, f"put {self._key(key)}") from exc

    def get_file(self, key: str, dest: Path) -> None:
        try:
            self.client.download_file(self.bucket, self._key(key), str(dest),
                                      Config=self.transfer)
        except (BotoCoreError, ClientError, RetriesExceededError) as exc:
            raise translate_error(exc, f"get {self._key(key)}") from exc

    def exists(self, key: str) -> bool:
        return self.size_of(key) is not None

    def size_of(self, key: str) -> int | None:
        """From a HEAD. The digest (`stored_sha256`) needs a read-back: S3's own stored
        checksums of multipart objects are per part, not of the whole object."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            err = translate_error(exc, f"head {self._key(key)}")
            if isinstance(err, ObjectNotFound):
                return None
            raise err from exc
        return int(head["ContentLength"])

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise translate_error(exc, f"bucket {self.bucket}") from exc

    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        """ListObjectsV2 pages (1,000 keys each); `modified_at` is S3's LastModified."""
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield StoredObject(obj["Key"][len(base):], int(obj.get("Size", 0)),
                                       obj["LastModified"])
        except (BotoCoreError, ClientError) as exc:
            raise translate_error(exc, f"list {base + prefix}") from exc

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            err = translate_error(exc, f"delete {self._key(key)}")
            if not isinstance(err, ObjectNotFound):
                raise err from exc
