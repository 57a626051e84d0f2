"""An embedded registry (SQLite, file:// storage, jobs run inline) holding one validated
adapter and its fp32 merged release: the starting point of the release catalog and
base-placement tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from controlplane.app import create_app
from controlplane.contracts import Capabilities
from controlplane.migrate import upgrade_to_head
from dataplane.artifacts import read_base_abi
from tests.controlplane.cp_helpers import bootstrap_token, close_app, make_settings, push_dir
from tests.merges.conftest import MergeAssets

NS = "acme"


@dataclass
class Registry:
    client: TestClient
    store_root: Path
    h_base: str
    artifact: dict[str, Any]
    merge: dict[str, Any]

    def alias(self, action: str, alias: str = "support", **body: Any) -> Any:
        return self.client.post(f"/v1/namespaces/{NS}/aliases/{alias}/{action}", json=body)

    def history(self, alias: str = "support") -> list[dict[str, Any]]:
        items = self.client.get(f"/v1/namespaces/{NS}/aliases/{alias}/history").json()["items"]
        return list(items)


def submit_merge(client: TestClient, h_base: str, base: Path, artifact_id: int,
           **extra: Any) -> dict[str, Any]:
    body = {"name": "support-merged", "base": h_base, "dtype": "fp32",
            "base_uri": f"file://{base}", "adapters": [{"artifact": artifact_id}], **extra}
    r = client.post(f"/v1/namespaces/{NS}/merges", json=body)
    assert r.status_code in (200, 202), r.text
    return dict(client.get(f"/v1/namespaces/{NS}/merges/{r.json()['id']}").json())


@contextmanager
def registry_client(tmp_path: Path, merge_assets: MergeAssets) -> Iterator[TestClient]:
    """An empty embedded registry's admin client (file:// imports from the assets'
    folder); its app is closed on exit."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade_to_head(url)
    settings = make_settings(url, tmp_path / "var", allow_file_uri_import=True,
                             file_import_roots=[merge_assets.base.parent])
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {bootstrap_token(settings)}"
        yield client
    close_app(app)


@contextmanager
def open_registry(tmp_path: Path, merge_assets: MergeAssets) -> Iterator[Registry]:
    """The registry holding the validated adapter and its merged release."""
    with registry_client(tmp_path, merge_assets) as client:
        abi = read_base_abi(merge_assets.base).to_record()
        h_base = str(abi["h_base"])
        assert client.post("/v1/bases", json={"name": "tiny", "abi": abi}).status_code == 201
        assert client.post("/v1/namespaces", json={"name": NS}).status_code == 201
        pushed = push_dir(client, dict(client.headers), NS, h_base, merge_assets.plain)
        assert pushed.status_code == 202, pushed.text
        artifact = client.get(f"/v1/namespaces/{NS}/artifacts/{pushed.json()['id']}").json()
        assert artifact["state"] == "validated", artifact
        merge = submit_merge(client, h_base, merge_assets.base, artifact["id"])
        assert merge["state"] == "merged", merge
        yield Registry(client, tmp_path / "var", h_base, artifact, merge)


def register(client: TestClient, name: str, h_base: str) -> tuple[int, int, dict[str, str]]:
    token = client.post("/v1/tokens", json={"name": name, "grants": [], "is_agent": True})
    headers = {"Authorization": f"Bearer {token.json()['token']}"}
    caps = Capabilities(base=h_base, dtypes=["float32"], max_rank=16, targets=["q_proj", "v_proj"],
                        adapter_slots=2, pool_pages=100, page_bytes=4096, kv_reserve_pages=50)
    me = client.post("/v1/agents/register", headers=headers, json={
        "name": name, "url": "http://127.0.0.1:1", "capabilities": caps.model_dump()}).json()
    return int(me["id"]), int(me["worker_epoch"]), headers
