"""An `s3://` import over `max_artifact_bytes` is refused before a byte is downloaded:
no temporary directory is made, no row is written (moto over HTTP)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import boto3
import pytest
from cp_helpers import Api, Assets, bootstrap_token, close_app, make_settings, setup_namespace
from fastapi.testclient import TestClient

from controlplane.app import create_app
from controlplane.errors import ArtifactTooLarge
from controlplane.storage import import_prefix

LIMIT = 1024 * 1024
KEYS = {"s3_access_key_id": "test", "s3_secret_access_key": "test-secret"}


def _upload_big(endpoint: str, assets: Assets, prefix: str) -> str:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test-secret")
    if "limits" not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket="limits")
    client.upload_file(str(assets.adapter_a / "adapter_config.json"), "limits",
                       f"{prefix}/adapter_config.json")
    client.put_object(Bucket="limits", Key=f"{prefix}/adapter_model.safetensors",
                      Body=os.urandom(3 * LIMIT))
    return f"s3://limits/{prefix}"


def test_oversized_s3_import_downloads_nothing(s3_endpoint: str, assets: Assets,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _upload_big(s3_endpoint, assets, "direct")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    settings = make_settings(f"sqlite:///{tmp_path / 'unused.db'}", tmp_path / "var",
                             s3_endpoint_url=s3_endpoint, max_artifact_bytes=LIMIT, **KEYS)
    with pytest.raises(ArtifactTooLarge) as refused, import_prefix(uri, settings):
        pass
    assert refused.value.detail["limit_bytes"] == LIMIT
    assert list(scratch.iterdir()) == []


def test_oversized_s3_push_leaves_no_rows_or_temp_files(s3_endpoint: str, assets: Assets,
                                                        sqlite_url: str,
                                                        tmp_path: Path) -> None:
    uri = _upload_big(s3_endpoint, assets, "api")
    settings = make_settings(sqlite_url, tmp_path / "var", s3_endpoint_url=s3_endpoint,
                             max_artifact_bytes=LIMIT, **KEYS)
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    before = {p.name for p in Path(tempfile.gettempdir()).glob("adapterplane-*")}
    try:
        api = Api(app=app, client=TestClient(app), settings=settings, admin=admin)
        setup_namespace(api, assets.abi)
        r = api.client.post("/v1/namespaces/acme/artifacts", headers=admin,
                            json={"base": assets.h_base, "uri": uri})
        assert (r.status_code, r.json()["code"]) == (413, "ARTIFACT_TOO_LARGE"), r.text
        listed = api.client.get("/v1/namespaces/acme/artifacts", headers=admin).json()
        assert listed["items"] == []
    finally:
        close_app(app)
    after = {p.name for p in Path(tempfile.gettempdir()).glob("adapterplane-*")}
    assert after <= before
