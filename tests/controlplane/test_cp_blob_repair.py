"""A stored blob whose bytes changed is never trusted: a re-push of the right bytes
repairs it, and a publish of an artifact whose blob is corrupt is refused (409
ARTIFACT_CORRUPT) and changes nothing. On the file store and on moto's S3 server."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from cp_helpers import Api, Assets, bootstrap_token, close_app, make_settings, push_dir
from fastapi.testclient import TestClient

from controlplane.app import create_app

BUCKET = "cp-blob-repair"
S3_CREDS = {"s3_access_key_id": "test", "s3_secret_access_key": "test-secret"}
MODEL = "adapter_model.safetensors"

Rewrite = Callable[[str, bytes], None]
"""Replace the stored bytes of an object key in the backend, behind the store's back."""


def flipped(data: bytes) -> bytes:
    """The same length, one byte changed: only a digest check can tell."""
    return data[:-1] + bytes([data[-1] ^ 0xFF])


@pytest.fixture(params=["file", "s3"])
def store_api(request: pytest.FixtureRequest, pg_url: str,
              tmp_path: Path) -> Iterator[tuple[Api, Rewrite, Callable[[str], bytes]]]:
    overrides: dict[str, Any] = {}
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test-secret")
        if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=BUCKET)
        prefix = f"objs-{tmp_path.name}"
        overrides = {"storage_url": f"s3://{BUCKET}/{prefix}", "s3_endpoint_url": endpoint,
                     **S3_CREDS}

        def rewrite(key: str, data: bytes) -> None:
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=data)

        def stored(key: str) -> bytes:
            body: bytes = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{key}")["Body"].read()
            return body
    else:
        root = tmp_path / "var" / "objects"

        def rewrite(key: str, data: bytes) -> None:
            with (root / key).open("r+b") as f:  # in place: same inode, same size
                f.write(data)

        def stored(key: str) -> bytes:
            return (root / key).read_bytes()
    settings = make_settings(pg_url, tmp_path / "var", **overrides)
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        api = Api(app=app, client=client, settings=settings, admin=admin)
        yield api, rewrite, stored
    close_app(app)


def setup(api: Api, assets: Assets) -> None:
    r = api.client.post("/v1/bases", headers=api.admin, json={"name": "tiny", "abi": assets.abi})
    assert r.status_code in (200, 201), r.text
    for ns in ("acme", "beta"):
        assert api.client.post("/v1/namespaces", headers=api.admin,
                               json={"name": ns}).status_code == 201


def artifact(api: Api, ns: str, artifact_id: int) -> dict[str, Any]:
    body: dict[str, Any] = api.client.get(f"/v1/namespaces/{ns}/artifacts/{artifact_id}",
                                          headers=api.admin).json()
    return body


def publish(api: Api, artifact_id: int) -> Any:
    return api.client.post("/v1/namespaces/acme/aliases/bot/publish", headers=api.admin,
                           json={"artifact": str(artifact_id)})


def audit_actions(api: Api) -> list[str]:
    items = api.client.get("/v1/audit?limit=200", headers=api.admin).json()["items"]
    return [e["action"] for e in items]


def test_corrupt_blob_is_refused_at_publish_and_repaired_by_a_push(
        store_api: tuple[Api, Rewrite, Callable[[str], bytes]], assets: Assets) -> None:
    api, rewrite, stored = store_api
    setup(api, assets)
    pushed = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_a)
    assert pushed.status_code == 202, pushed.text
    art = artifact(api, "acme", pushed.json()["id"])
    assert art["state"] == "validated"
    good = (assets.adapter_a / MODEL).read_bytes()
    key = art["files"][MODEL]["key"]
    assert art["files"][MODEL]["sha256"] == hashlib.sha256(good).hexdigest()
    rewrite(key, flipped(good))

    # publish refuses the artifact and writes nothing
    before = audit_actions(api)
    refused = publish(api, art["id"])
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["code"] == "ARTIFACT_CORRUPT"
    assert body["detail"] == {"artifact_id": art["id"], "file": MODEL, "key": key,
                              "fault": "digest"}
    assert audit_actions(api) == before
    assert api.client.get("/v1/namespaces/acme/aliases/bot",
                          headers=api.admin).status_code == 404
    assert api.client.get("/v1/namespaces/acme/aliases", headers=api.admin
                          ).json()["items"] == []

    # a push of the same bytes elsewhere validates (the blob is repaired, not trusted)
    again = push_dir(api.client, api.admin, "beta", assets.h_base, assets.adapter_a)
    assert again.status_code == 202, again.text
    other = artifact(api, "beta", again.json()["id"])
    assert other["state"] == "validated", other["rejection"]
    assert stored(key) == good
    assert publish(api, art["id"]).status_code == 201

    # corrupted again, then a re-push of the same artifact repairs it in place
    rewrite(key, flipped(good))
    assert publish(api, art["id"]).json()["code"] == "ARTIFACT_CORRUPT"
    repush = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_a)
    assert repush.status_code == 200 and repush.json()["id"] == art["id"], repush.text
    assert stored(key) == good
    done = publish(api, art["id"])
    assert done.status_code == 201 and done.json()["generation"] == 2, done.text
    assert audit_actions(api).count("catalog.publish") == 2


def test_truncated_blob_is_refused(
        store_api: tuple[Api, Rewrite, Callable[[str], bytes]], assets: Assets,
        tmp_path: Path) -> None:
    api, _rewrite, _stored = store_api
    setup(api, assets)
    pushed = push_dir(api.client, api.admin, "acme", assets.h_base, assets.adapter_b)
    art = artifact(api, "acme", pushed.json()["id"])
    config = art["files"]["adapter_config.json"]
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"{}")
    api.app.state.store.put_file(config["key"], replacement)
    refused = publish(api, art["id"])
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"]["fault"] == "size"
    assert refused.json()["detail"]["file"] == "adapter_config.json"
    assert "catalog.publish" not in audit_actions(api)
