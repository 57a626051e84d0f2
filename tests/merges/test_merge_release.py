"""Merged releases end to end: adapterctl against a real API and a real Celery worker
(processes started by `EmbeddedStack`, as `adapterplane up` does), the base checkpoint read
from moto's S3 server or a file:// root, releases stored in the file:// object store."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from cli.main import app
from cli.stack import EmbeddedStack
from controlplane.merges.manifest import h_merged
from dataplane.artifacts import read_base_abi
from tests.merges.conftest import MergeAssets

BUCKET = "merge-bases"
S3_KEY = "testing"
Invoke = Callable[..., Result]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str,
          schema_database: Callable[[str], AbstractContextManager[str]]
          ) -> Iterator[EmbeddedStack]:
    with schema_database("merges") as url:
        stack = EmbeddedStack(tmp_path_factory.mktemp("merge-stack"), port=0,
                              embedded_only=True, extra_env={
            "ADAPTERPLANE_DATABASE_URL": url, "ADAPTERPLANE_ENVIRONMENT": "test",
            "ADAPTERPLANE_S3_ENDPOINT_URL": s3_endpoint,
            "ADAPTERPLANE_S3_ACCESS_KEY_ID": S3_KEY,
            "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": S3_KEY,
            "ADAPTERPLANE_ALLOW_FILE_URI_IMPORT": "true",
            "ADAPTERPLANE_FILE_IMPORT_ROOTS": json.dumps([str(tmp_path_factory.getbasetemp())]),
        })
        with stack:
            yield stack


@pytest.fixture(scope="module")
def adapterctl(stack: EmbeddedStack) -> Invoke:
    runner = CliRunner()
    env = {"ADAPTERPLANE_URL": stack.url, "ADAPTERPLANE_TOKEN": stack.token()}
    return lambda *args: runner.invoke(app, list(args), env=env, catch_exceptions=False)


@pytest.fixture(scope="module")
def api(stack: EmbeddedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60,
                      headers={"Authorization": f"Bearer {stack.token()}"}) as client:
        yield client


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def bases(adapterctl: Invoke, merge_assets: MergeAssets) -> dict[str, str]:
    tiny = ok_json(adapterctl("-o", "json", "bases", "register", str(merge_assets.base),
                              "--name", "merge-tiny"))
    other = ok_json(adapterctl("-o", "json", "bases", "register",
                               str(merge_assets.other_base), "--name", "merge-other"))
    return {"tiny": tiny["h_base"], "other": other["h_base"]}


@pytest.fixture(scope="module")
def base_uri(s3_endpoint: str, merge_assets: MergeAssets) -> str:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY)
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(merge_assets.base.iterdir()):
        client.upload_file(str(path), BUCKET, f"tiny/{path.name}")
    return f"s3://{BUCKET}/tiny"


def _namespace(adapterctl: Invoke) -> str:
    name = f"m-{uuid.uuid4().hex[:10]}"
    assert adapterctl("namespaces", "create", name).exit_code == 0
    return name


def _push(adapterctl: Invoke, ns: str, h_base: str, directory: Path) -> dict[str, Any]:
    result = adapterctl("-o", "json", "push", str(directory), "-n", ns, "-b", h_base,
                        "--wait", "--timeout", "60")
    artifact: dict[str, Any] = json.loads(result.stdout)
    return artifact


def _blobs(stack: EmbeddedStack) -> list[Path]:
    return sorted(p for p in (stack.data_dir / "objects").rglob("*") if p.is_file())


def _audit(api: httpx.Client, ns: str) -> list[str]:
    return [e["action"] for e in api.get("/v1/audit", params={"namespace": ns,
                                                               "limit": 200}).json()["items"]]


def test_release_lineage_and_idempotency(adapterctl: Invoke, api: httpx.Client,
                                         stack: EmbeddedStack, bases: dict[str, str],
                                         base_uri: str, merge_assets: MergeAssets) -> None:
    ns = _namespace(adapterctl)
    first = _push(adapterctl, ns, bases["tiny"], merge_assets.patterned)
    second = _push(adapterctl, ns, bases["tiny"], merge_assets.rslora)
    args = ["merges", "create", ns, "--base", "merge-tiny", "-a", str(first["id"]),
            "-a", f"sha256:{second['digest']}@1/2", "--dtype", "bf16", "--name", "support",
            "--base-uri", base_uri]
    merged = ok_json(adapterctl("-o", "json", *args, "--wait", "--timeout", "300"))
    assert merged["state"] == "merged", merged
    assert [(a["artifact_id"], a["digest"], a["weight"]) for a in merged["adapters"]] == [
        (first["id"], first["digest"], "1/1"), (second["id"], second["digest"], "1/2")]
    assert merged["metrics"]["passed"] and merged["metrics"]["max_relative_error"] < 1 / 20
    assert merged["spec"] == {"max_relative_error": "1/20"}
    assert merged["digest"] == h_merged(merged["manifest"])
    assert merged["manifest"]["source"]["h_base"] == bases["tiny"]
    assert merged["manifest"]["dtype_schedule"]["output"] == "bfloat16"

    # the release's stored files are a checkpoint whose ABI is the registered merged base
    release = stack.data_dir / "release"
    release.mkdir()
    for name, meta in merged["files"].items():
        (release / name).write_bytes((stack.data_dir / "objects" / meta["key"]).read_bytes())
    assert read_base_abi(release).h_base == merged["merged_base"]
    stored = json.loads((release / "merge.json").read_text())
    assert stored == {"h_merged": merged["digest"], "manifest": merged["manifest"]}

    shown = ok_json(adapterctl("-o", "json", "bases", "show", merged["merged_base"]))
    assert [m["id"] for m in shown["lineage"]] == [merged["id"]]
    assert ok_json(adapterctl("-o", "json", "bases", "show", bases["tiny"]))["lineage"] == []
    table = adapterctl("bases", "show", merged["merged_base"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert bases["tiny"][:12] in text and "support" in text
    assert text.index(first["digest"][:12]) < text.index(second["digest"][:12])

    # the same request: the same row; the same release in another namespace: one copy
    again = api.post(f"/v1/namespaces/{ns}/merges", json={
        "name": "support", "base": bases["tiny"], "dtype": "bf16", "base_uri": base_uri,
        "adapters": [{"artifact": first["id"]},
                     {"artifact": f"sha256:{second['digest']}", "weight": "0.5"}]})
    assert again.status_code == 200 and again.json()["id"] == merged["id"]
    blobs = _blobs(stack)
    ns2 = _namespace(adapterctl)
    p2 = _push(adapterctl, ns2, bases["tiny"], merge_assets.patterned)
    r2 = _push(adapterctl, ns2, bases["tiny"], merge_assets.rslora)
    twin = ok_json(adapterctl("-o", "json", "merges", "create", ns2, "--base", bases["tiny"],
                              "-a", str(p2["id"]), "-a", f"{r2['id']}@1/2", "--dtype", "bf16",
                              "--name", "twin", "--base-uri", base_uri, "--wait"))
    assert (twin["state"], twin["digest"], twin["merged_base"]) == (
        "merged", merged["digest"], merged["merged_base"])
    assert twin["files"] == merged["files"]
    assert _blobs(stack) == blobs  # adapters and release were stored already: no new bytes
    names = [b["name"] for b in api.get("/v1/bases", params={"limit": 200}).json()["items"]]
    assert names.count(f"{ns}/support") == 1 and f"{ns2}/twin" not in names
    shown = ok_json(adapterctl("-o", "json", "bases", "show", merged["merged_base"]))
    assert [m["id"] for m in shown["lineage"]] == [merged["id"], twin["id"]]

    listed = ok_json(adapterctl("-o", "json", "merges", "list", ns, "--state", "merged"))
    assert [m["id"] for m in listed["items"]] == [merged["id"]]
    by_digest = ok_json(adapterctl("-o", "json", "merges", "show", ns,
                                   f"sha256:{merged['digest']}"))
    assert by_digest["id"] == merged["id"]
    audit = _audit(api, ns)
    assert audit.count("merge.submit") == 1 and audit.count("merge.released") == 1


def test_gate_and_source_refusals_keep_their_reasons(adapterctl: Invoke, api: httpx.Client,
                                                     stack: EmbeddedStack,
                                                     bases: dict[str, str], base_uri: str,
                                                     merge_assets: MergeAssets) -> None:
    ns = _namespace(adapterctl)
    plain = _push(adapterctl, ns, bases["tiny"], merge_assets.plain)
    before = api.get("/v1/bases", params={"limit": 200}).json()["items"]
    refused = adapterctl("-o", "json", "merges", "create", ns, "--base", bases["tiny"],
                         "-a", str(plain["id"]), "--dtype", "bf16", "--name", "strict",
                         "--base-uri", base_uri, "--max-relative-error", "0", "--wait")
    assert refused.exit_code == 5, refused.output
    assert "merge_inexact" in refused.output
    merge = api.get(f"/v1/namespaces/{ns}/merges").json()["items"][0]
    assert merge["state"] == "rejected" and merge["rejection"]["code"] == "merge_inexact"
    assert merge["metrics"]["max_relative_error"] > 0 and not merge["metrics"]["passed"]
    assert merge["digest"] is None and merge["files"] is None and merge["merged_base"] is None

    wrong = f"file://{merge_assets.other_base}"
    mismatch = adapterctl("-o", "json", "merges", "create", ns, "--base", bases["tiny"],
                          "-a", str(plain["id"]), "--dtype", "fp32", "--name", "wrong",
                          "--base-uri", wrong, "--wait")
    assert mismatch.exit_code == 5 and "base_mismatch" in mismatch.output
    assert api.get("/v1/bases", params={"limit": 200}).json()["items"] == before
    assert _audit(api, ns).count("merge.rejected") == 2


def test_bad_requests_change_nothing(adapterctl: Invoke, api: httpx.Client,
                                     bases: dict[str, str], base_uri: str,
                                     merge_assets: MergeAssets, tmp_path: Path) -> None:
    ns = _namespace(adapterctl)
    plain = _push(adapterctl, ns, bases["tiny"], merge_assets.plain)
    alora = _push(adapterctl, ns, bases["tiny"], merge_assets.alora)
    foreign = _push(adapterctl, ns, bases["other"], merge_assets.other)
    nan_dir = tmp_path / "nan"
    nan_dir.mkdir()
    (nan_dir / "adapter_config.json").write_bytes(
        (merge_assets.plain / "adapter_config.json").read_bytes())
    tensors = load_file(merge_assets.plain / "adapter_model.safetensors")
    key = sorted(k for k in tensors if "lora_B" in k)[0]
    tensors[key] = tensors[key].clone()
    tensors[key][0, 0] = torch.nan
    save_file(tensors, nan_dir / "adapter_model.safetensors")
    rejected = _push(adapterctl, ns, bases["tiny"], nan_dir)
    assert (plain["state"], alora["state"], foreign["state"], rejected["state"]) == (
        "validated", "validated", "validated", "rejected")
    reader = api.post("/v1/tokens", json={"name": "r", "grants": [
        {"namespace": ns, "role": "read"}]}).json()["token"]
    before = _audit(api, ns)
    good = {"name": "n", "base": bases["tiny"], "dtype": "fp32", "base_uri": base_uri,
            "adapters": [{"artifact": plain["id"]}]}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"adapters": [{"artifact": rejected["id"]}]}, 409, "INVALID_STATE"),
        ({"adapters": [{"artifact": plain["id"]}, {"artifact": foreign["id"]}]}, 422,
         "BASE_MISMATCH"),
        ({"adapters": [{"artifact": alora["id"]}]}, 422, "ALORA_UNSUPPORTED"),
        ({"dtype": "int8"}, 422, "VALIDATION_ERROR"),
        ({"adapters": [{"artifact": plain["id"], "weight": "0"}]}, 422, "VALIDATION_ERROR"),
        ({"adapters": [{"artifact": plain["id"], "weight": "x"}]}, 422, "VALIDATION_ERROR"),
        ({"adapters": [{"artifact": plain["id"]}, {"artifact": f"sha256:{plain['digest']}"}]},
         422, "VALIDATION_ERROR"),
        ({"adapters": []}, 422, "VALIDATION_ERROR"),
        ({"adapters": [{"artifact": 999999}]}, 404, "NOT_FOUND"),
        ({"base": "0" * 64}, 404, "NOT_FOUND"),
        ({"base_uri": "http://example.com/base"}, 422, "VALIDATION_ERROR"),
        ({"max_relative_error": "2"}, 422, "VALIDATION_ERROR"),
    ]
    for change, status, code in cases:
        r = api.post(f"/v1/namespaces/{ns}/merges", json={**good, **change})
        assert (r.status_code, r.json()["code"]) == (status, code), (change, r.text)
    r = api.post(f"/v1/namespaces/{ns}/merges", json=good,
                 headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403
    assert api.get(f"/v1/namespaces/{ns}/merges").json()["items"] == []
    assert _audit(api, ns) == before
    usage = adapterctl("merges", "create", ns, "--base", bases["tiny"], "-a", "1@",
                       "--dtype", "fp32", "--name", "n", "--base-uri", base_uri)
    assert usage.exit_code == 2
