"""Presigned URLs are short-lived and their signatures reach no log line: not httpx's
INFO request line, not uvicorn's access line, not a structlog event (moto over HTTP)."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import httpx
import pytest
import structlog

from controlplane.config import Settings
from controlplane.kit.request_log import configure_logging
from controlplane.storage import store_from_settings
from controlplane.storage.urls import object_url

SIGNING = ("X-Amz-Signature", "X-Amz-Credential", "Signature", "AWSAccessKeyId")


def _secrets(url: str) -> list[str]:
    query = parse_qs(urlparse(url).query)
    found = [query[name][0] for name in SIGNING if name in query]
    assert found and all(found), url
    return found


@pytest.fixture
def presigned(s3_endpoint: str, tmp_path: Path) -> str:
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test-secret",
                 ).create_bucket(Bucket="redact")
    settings = Settings(environment="test", data_dir=tmp_path, storage_url="s3://redact/o",
                        s3_endpoint_url=s3_endpoint, s3_access_key_id="test",
                        s3_secret_access_key="test-secret")  # type: ignore[arg-type]
    store = store_from_settings(settings)
    ref = store.put_blob_bytes(b"weights")
    return object_url(store, ref.key)


def test_presigned_urls_live_minutes_not_hours(presigned: str) -> None:
    query = parse_qs(urlparse(presigned).query)
    if "X-Amz-Expires" in query:  # SigV4
        assert query["X-Amz-Expires"] == ["300"]
    else:  # SigV2: an absolute expiry
        assert 290 <= int(query["Expires"][0]) - time.time() <= 300
    _secrets(presigned)


def test_no_log_line_carries_a_signature(presigned: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    configure_logging("info")
    secrets = _secrets(presigned)
    access = logging.getLogger("uvicorn.access")  # does not propagate once uvicorn ran
    access.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, "uvicorn.access"):
            assert httpx.get(presigned).content == b"weights"  # httpx logs it at INFO
            access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", presigned, "1.1", 200)
    finally:
        access.removeHandler(caplog.handler)
    lines = [record.getMessage() for record in caplog.records]
    assert sum("Signature=[redacted]" in line for line in lines) >= 2, lines
    assert not any(secret in line for secret in secrets for line in lines), lines

    out = io.StringIO()
    structlog.configure(processors=[
        *structlog.get_config()["processors"][:-1], structlog.processors.JSONRenderer()],
        logger_factory=lambda *_: structlog.WriteLogger(out))
    structlog.get_logger("t").info("download", url=presigned, note=f"got {presigned}")
    event = json.loads(out.getvalue())
    configure_logging("info")
    assert not any(secret in json.dumps(event) for secret in secrets), event
    assert "Signature=[redacted]" in event["url"] and "Signature=[redacted]" in event["note"]
