"""Driving the real processes of the agent tests: the admin REST API as a client would
use it, and agent processes (`agent.supervisor.AgentProcess`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from agent.supervisor import AgentProcess

__all__ = ["Admin", "AgentProcess"]


class Admin:
    """The control plane's REST API with an admin token (plain httpx, as a client would)."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30.0,
                                 headers={"Authorization": f"Bearer {token}"})

    def call(self, method: str, path: str, **kw: Any) -> Any:
        response = self.http.request(method, path, **kw)
        if response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def push(self, namespace: str, h_base: str, adapter: Path) -> dict[str, Any]:
        files = {n: (n, (adapter / n).read_bytes())
                 for n in ("adapter_config.json", "adapter_model.safetensors")}
        art = self.call("POST", f"/v1/namespaces/{namespace}/artifacts",
                        data={"base": h_base}, files=files)
        deadline = time.monotonic() + 60
        while art["state"] not in ("validated", "rejected"):
            if time.monotonic() > deadline:
                raise AssertionError(f"artifact {art['id']} still {art['state']}")
            time.sleep(0.1)
            art = self.call("GET", f"/v1/namespaces/{namespace}/artifacts/{art['id']}")
        assert art["state"] == "validated", art
        return dict(art)

    def publish(self, namespace: str, alias: str, artifact_id: int) -> int:
        gen = self.call("POST", f"/v1/namespaces/{namespace}/aliases/{alias}/publish",
                        json={"artifact": str(artifact_id)})
        return int(gen["generation"])

    def retire(self, namespace: str, alias: str) -> int:
        gen = self.call("POST", f"/v1/namespaces/{namespace}/aliases/{alias}/retire", json={})
        return int(gen["generation"])

    def rollback(self, namespace: str, alias: str) -> int:
        gen = self.call("POST", f"/v1/namespaces/{namespace}/aliases/{alias}/rollback",
                        json={})
        return int(gen["generation"])

    def token(self, name: str, grants: list[dict[str, str]], is_agent: bool = False) -> str:
        doc = self.call("POST", "/v1/tokens",
                        json={"name": name, "grants": grants, "is_agent": is_agent})
        return str(doc["token"])
