"""Object stores: content-addressed blobs, digest check on read, streaming multipart
upload to S3 (moto over HTTP), prefix import with pickle refusal, transient errors."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import boto3
import pytest
from cp_helpers import free_port

from controlplane.app import close_app_resources
from controlplane.config import Settings
from controlplane.errors import BadRequest, ForbiddenFile, MissingFile
from controlplane.storage import (
    BlobTooLarge,
    ChecksumMismatch,
    ObjectNotFound,
    TransientStorageError,
    blob_key,
    import_prefix,
    store_from_settings,
)

S3_KEYS = {"s3_access_key_id": "test", "s3_secret_access_key": "test-secret"}


def s3_settings(endpoint: str, bucket: str, tmp_path: Path, **kw: object) -> Settings:
    return Settings(environment="test", data_dir=tmp_path, storage_url=f"s3://{bucket}/objs",
                    s3_endpoint_url=endpoint, **S3_KEYS, **kw)  # type: ignore[arg-type]


def make_bucket(endpoint: str, name: str) -> object:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test-secret")
    client.create_bucket(Bucket=name)
    return client


def test_file_store_roundtrip_and_checksum(tmp_path: Path) -> None:
    store = store_from_settings(Settings(environment="test", data_dir=tmp_path))
    data = os.urandom(3 * 1024 * 1024 + 7)
    ref = store.put_blob(io.BytesIO(data))
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.key == blob_key(ref.sha256) and ref.size == len(data)
    out = tmp_path / "out"
    store.get_blob(ref.key, out, expected_sha256=ref.sha256)
    assert out.read_bytes() == data
    # corrupt the stored object: the read must refuse it and leave no copy behind
    (tmp_path / "objects" / ref.key).write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(ChecksumMismatch):
        store.get_blob(ref.key, tmp_path / "bad", expected_sha256=ref.sha256)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ObjectNotFound):
        store.get_file(blob_key("0" * 64), tmp_path / "x")
    with pytest.raises(BlobTooLarge):
        store.put_blob(io.BytesIO(data), max_bytes=1024)


def test_s3_store_multipart_roundtrip_and_checksum(s3_endpoint: str, tmp_path: Path) -> None:
    client = make_bucket(s3_endpoint, "store-test")
    store = store_from_settings(s3_settings(s3_endpoint, "store-test", tmp_path,
                                            s3_multipart_chunk_bytes=5 * 1024 * 1024))
    store.check()
    data = os.urandom(11 * 1024 * 1024)  # three multipart parts
    ref = store.put_blob(io.BytesIO(data))
    head = client.head_object(Bucket="store-test", Key=f"objs/{ref.key}")  # type: ignore[attr-defined]
    assert head["ContentLength"] == len(data) and "-3" in head["ETag"]
    out = tmp_path / "out"
    store.get_blob(ref.key, out, expected_sha256=ref.sha256)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == ref.sha256
    client.put_object(Bucket="store-test", Key=f"objs/{ref.key}", Body=b"tampered")  # type: ignore[attr-defined]
    with pytest.raises(ChecksumMismatch):
        store.get_blob(ref.key, tmp_path / "bad", expected_sha256=ref.sha256)
    assert not store.exists(blob_key("f" * 64))


def test_s3_unreachable_is_transient(tmp_path: Path) -> None:
    settings = s3_settings(f"http://127.0.0.1:{free_port()}", "nowhere", tmp_path,
                           s3_max_attempts=1)
    store = store_from_settings(settings)
    with pytest.raises(TransientStorageError):
        store.get_file(blob_key("a" * 64), tmp_path / "x")


def test_import_prefix_s3_and_file(s3_endpoint: str, tmp_path: Path) -> None:
    client = make_bucket(s3_endpoint, "adapters")
    files = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"\x00" * 64}
    for name, body in files.items():
        client.put_object(Bucket="adapters", Key=f"team/a1/{name}", Body=body)  # type: ignore[attr-defined]
    client.put_object(Bucket="adapters", Key="team/a1/nested/ignored.txt", Body=b"x")  # type: ignore[attr-defined]
    settings = s3_settings(s3_endpoint, "adapters", tmp_path)
    with import_prefix("s3://adapters/team/a1", settings) as streams:
        assert {n: f.read() for n, f in streams.items()} == files
    client.put_object(Bucket="adapters", Key="team/a1/adapter_model.bin", Body=b"pickle")  # type: ignore[attr-defined]
    with pytest.raises(ForbiddenFile) as forbidden, \
            import_prefix("s3://adapters/team/a1", settings):
        pass
    assert forbidden.value.detail["files"] == ["adapter_model.bin"]
    with pytest.raises(MissingFile), import_prefix("s3://adapters/team/none", settings):
        pass
    with pytest.raises(MissingFile), import_prefix("s3://no-such-bucket/team/a1", settings):
        pass  # the caller's mistake (4xx), not a storage fault (502)
    with pytest.raises(BadRequest), import_prefix("s3://Not A Bucket!/x", settings):
        pass
    local = tmp_path / "local"
    local.mkdir()
    (local / "adapter_config.json").write_bytes(files["adapter_config.json"])
    local_ok = s3_settings(s3_endpoint, "adapters", tmp_path, allow_file_uri_import=True,
                           file_import_roots=[tmp_path])
    with pytest.raises(MissingFile), import_prefix(local.as_uri(), local_ok):
        pass


def test_readyz_reports_unreachable_storage(s3_endpoint: str, tmp_path: Path,
                                            sqlite_url: str) -> None:
    from fastapi.testclient import TestClient

    from controlplane.app import create_app

    settings = s3_settings(s3_endpoint, "no-such-bucket", tmp_path, database_url=sqlite_url)
    app = create_app(settings)
    try:
        r = TestClient(app).get("/readyz")
        assert r.status_code == 503
        assert r.json()["status"] == "not_ready"
        assert r.json()["checks"]["database"] == "ok"
        assert r.json()["checks"]["storage"].startswith("error")
        make_bucket(s3_endpoint, "no-such-bucket")
        assert TestClient(app).get("/readyz").status_code == 200
    finally:
        close_app_resources(app)
