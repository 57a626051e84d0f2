"""`adapterctl push URI`: import from s3:// (moto over HTTP) and file://, and the
typed refusals for a prefix with pickle weights or without the adapter files."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from typer.testing import Result

Invoke = Callable[..., Result]
PushWait = Callable[[str], Result]
"""tests/cli/conftest.py's `push_wait`: push SOURCE into the test namespace with --wait."""
CliAssets = Any
"""tests/cli/conftest.py's CliAssets (base, adapter_a, adapter_b, adapter_nan)."""


def _upload(s3_endpoint: str, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for name, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)


def _adapter_files(directory: Path) -> dict[str, bytes]:
    return {
        name: (directory / name).read_bytes()
        for name in ("adapter_config.json", "adapter_model.safetensors")
    }


def test_push_from_s3_and_file_uris(
    adapterctl: Invoke,
    cli_assets: CliAssets,
    h_base: str,
    namespace: str,
    s3_endpoint: str,
    push_wait: PushWait,
) -> None:
    bucket, prefix = "cli-adapters", f"runs/{uuid.uuid4().hex[:8]}/a"
    _upload(s3_endpoint, bucket, prefix, _adapter_files(cli_assets.adapter_a))
    from_s3 = push_wait(f"s3://{bucket}/{prefix}")
    assert from_s3.exit_code == 0, from_s3.output
    a = json.loads(from_s3.stdout)
    assert a["state"] == "validated"

    # The same bytes from a local directory (multipart) are the same artifact.
    uploaded = adapterctl(
        "-o", "json", "push", str(cli_assets.adapter_a), "-n", namespace, "-b", h_base
    )
    assert json.loads(uploaded.stdout)["id"] == a["id"]

    from_file = push_wait(cli_assets.adapter_b.resolve().as_uri())
    assert from_file.exit_code == 0, from_file.output
    b = json.loads(from_file.stdout)
    assert b["state"] == "validated" and b["digest"] != a["digest"]


def test_push_refusals_from_object_storage(
    adapterctl: Invoke, cli_assets: CliAssets, h_base: str, namespace: str, s3_endpoint: str
) -> None:
    bucket, prefix = "cli-adapters", f"runs/{uuid.uuid4().hex[:8]}"
    _upload(
        s3_endpoint,
        bucket,
        f"{prefix}/pickled",
        {**_adapter_files(cli_assets.adapter_a), "adapter_model.bin": b"\x80\x04pickle"},
    )
    pickled = adapterctl("push", f"s3://{bucket}/{prefix}/pickled", "-n", namespace, "-b", h_base)
    assert pickled.exit_code == 5
    assert pickled.stderr.startswith("error: FORBIDDEN_FILE: ")
    empty = adapterctl(
        "push", f"s3://{bucket}/{prefix}/nothing-here", "-n", namespace, "-b", h_base
    )
    assert empty.exit_code == 5
    assert empty.stderr.startswith("error: MISSING_FILE: ")
    bad_scheme = adapterctl("push", "https://example.com/adapter", "-n", namespace, "-b", h_base)
    assert bad_scheme.exit_code == 2
    listed = json.loads(adapterctl("-o", "json", "artifacts", "list", namespace).stdout)
    assert listed["items"] == []
