"""A merged release on the embedded default: SQLite registry, file:// storage, the job run
inline (Celery eager mode) by the real task, and the base checkpoint read from file://."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dataplane.artifacts import read_base_abi
from tests.controlplane.cp_helpers import push_dir
from tests.merges.conftest import MergeAssets
from tests.merges.registry import registry_client


@pytest.fixture
def client(tmp_path: Path, merge_assets: MergeAssets) -> Iterator[TestClient]:
    with registry_client(tmp_path, merge_assets) as test_client:
        yield test_client


def test_fp32_release_on_sqlite(client: TestClient, merge_assets: MergeAssets) -> None:
    abi = read_base_abi(merge_assets.base).to_record()
    assert client.post("/v1/bases", json={"name": "tiny", "abi": abi}).status_code == 201
    assert client.post("/v1/namespaces", json={"name": "acme"}).status_code == 201
    pushed = push_dir(client, dict(client.headers), "acme", str(abi["h_base"]),
                      merge_assets.rslora)
    assert pushed.status_code == 202, pushed.text
    body = {"name": "rs", "base": abi["h_base"], "dtype": "fp32",
            "base_uri": f"file://{merge_assets.base}",
            "adapters": [{"artifact": pushed.json()["id"], "weight": "3/4"}]}
    r = client.post("/v1/namespaces/acme/merges", json=body)
    assert r.status_code == 202, r.text
    merge = client.get(f"/v1/namespaces/acme/merges/{r.json()['id']}").json()
    assert merge["state"] == "merged", merge
    assert merge["metrics"]["max_relative_error"] < 1e-5
    assert merge["adapters"][0]["weight"] == "3/4"
    assert merge["manifest"]["adapters"][0]["weight"] == {"num": 3, "den": 4}
    merged_base = client.get(f"/v1/bases/{merge['merged_base']}").json()
    assert merged_base["name"] == "acme/rs" and merged_base["abi"]["dtype"] == "float32"
    lineage = client.get(f"/v1/bases/{merge['merged_base']}/lineage").json()
    assert [m["id"] for m in lineage["merges"]] == [merge["id"]]
    outside = client.post("/v1/namespaces/acme/merges",
                          json={**body, "base_uri": "file:///etc"})
    assert (outside.status_code, outside.json()["code"]) == (422, "IMPORT_SOURCE_UNAVAILABLE")
