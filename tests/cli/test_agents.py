"""`adapterctl agents` against the real API: an agent registers and heartbeats over HTTP
(as the daemon does), then the CLI lists it with its state and resident adapters."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from typer.testing import Result

from cli.stack import EmbeddedStack

Invoke = Callable[..., Result]


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_agents_list_and_show(adapterctl: Invoke, control_plane: EmbeddedStack,
                              h_base: str) -> None:
    token = ok_json(adapterctl("-o", "json", "tokens", "create", "--name",
                               f"ag-{uuid.uuid4().hex[:6]}", "--agent"))["token"]
    name = f"cli-agent-{uuid.uuid4().hex[:8]}"
    caps = {"base": h_base, "dtypes": ["float32"], "max_rank": 8, "targets": ["q_proj"],
            "adapter_slots": 2, "pool_pages": 64, "page_bytes": 8192, "kv_reserve_pages": 4}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=control_plane.url, headers=headers, timeout=10) as http:
        reg = http.post("/v1/agents/register",
                        json={"name": name, "url": "http://127.0.0.1:9", "capabilities": caps})
        assert reg.status_code == 201, reg.text
        agent = reg.json()
        slots = [{"artifact_digest": "ab" * 32, "state": "active", "refcount": 2, "slot": 0,
                  "collection": "ef" * 32},
                 {"artifact_digest": "cd" * 32, "state": "loading", "waiting": 1}]
        beat = http.post(f"/v1/agents/{agent['id']}/heartbeat",
                         json={"worker_epoch": agent["worker_epoch"], "catalog_version": 3,
                               "slots": slots})
        assert beat.status_code == 200, beat.text

    listed = ok_json(adapterctl("-o", "json", "agents"))
    mine = [a for a in listed if a["name"] == name]
    assert len(mine) == 1 and mine[0]["state"] == "live"
    assert mine[0]["last_heartbeat_at"] and mine[0]["catalog_version"] == 3
    assert ok_json(adapterctl("-o", "json", "agents", "list")) == listed

    table = adapterctl("agents")
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if name in line)
    assert "live" in row and "abababababab" in row and "cdcdcdcdcdcd" not in row

    shown = ok_json(adapterctl("-o", "json", "agents", "show", str(agent["id"])))
    assert shown["id"] == agent["id"] and len(shown["slots"]) == 2
    assert ok_json(adapterctl("-o", "json", "agents", "show", name))["id"] == agent["id"]
    text = adapterctl("agents", "show", name)
    assert text.exit_code == 0 and "loading" in text.stdout and "pool_pages=64" in text.stdout
    assert "efefefefefef" in text.stdout  # the slot served from a collection
    assert [s.get("collection") for s in shown["slots"]] == ["ef" * 32, None]

    missing = adapterctl("agents", "show", "no-such-agent")
    assert missing.exit_code == 3 and "NOT_FOUND" in missing.stderr
    unknown_id = adapterctl("agents", "show", "987654321")
    assert unknown_id.exit_code == 3


def test_agents_unbind_moves_a_name_to_another_token(adapterctl: Invoke,
                                                     control_plane: EmbeddedStack,
                                                     h_base: str) -> None:
    tokens = [ok_json(adapterctl("-o", "json", "tokens", "create", "--name",
                                 f"ag-{uuid.uuid4().hex[:6]}", "--agent"))["token"]
              for _ in range(2)]
    name = f"cli-agent-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "url": "http://127.0.0.1:9",
            "capabilities": {"base": h_base, "dtypes": ["float32"], "max_rank": 8,
                             "targets": ["q_proj"], "adapter_slots": 2, "pool_pages": 64,
                             "page_bytes": 8192, "kv_reserve_pages": 4}}

    def register(token: str) -> httpx.Response:
        with httpx.Client(base_url=control_plane.url, timeout=10,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            return http.post("/v1/agents/register", json=body)

    assert register(tokens[0]).status_code == 201
    refused = register(tokens[1])
    assert refused.status_code == 409 and refused.json()["code"] == "AGENT_NAME_BOUND"
    unbound = ok_json(adapterctl("-o", "json", "agents", "unbind", name))
    assert unbound["name"] == name
    assert register(tokens[1]).status_code == 201
    assert register(tokens[0]).status_code == 409
