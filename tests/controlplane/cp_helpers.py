"""Helpers for control-plane tests: settings, tokens, in-process and live API servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from controlplane.app import close_app_resources
from controlplane.auth.service import create_bootstrap_token
from controlplane.config import Settings
from controlplane.db import make_engine, make_session_factory

MAX_RANK = 16


@dataclass(frozen=True)
class Assets:
    """Paths and ABI records made once per session by the `assets` fixture."""

    base_dir: Path
    abi: dict[str, Any]
    h_base: str
    other_base_dir: Path
    other_abi: dict[str, Any]
    adapter_a: Path
    adapter_b: Path
    adapter_big_rank: Path
    adapter_other_base: Path
    adapter_with_bin: Path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- apps and clients


def make_settings(database_url: str, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "environment": "test", "database_url": database_url, "data_dir": data_dir,
        "celery_broker_url": "memory://", "celery_result_backend": "cache+memory://",
        "celery_task_always_eager": True, "max_rank": MAX_RANK, "database_pool_size": 5,
    }
    values.update(overrides)
    return Settings(**values)


def bootstrap_token(settings: Settings) -> str:
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with make_session_factory(engine)() as session:
            return create_bootstrap_token(session, "admin")
    finally:
        engine.dispose()


def close_app(app: FastAPI) -> None:
    close_app_resources(app)


@dataclass
class Api:
    """An in-process API (jobs run inline) plus an admin token."""

    app: FastAPI
    client: TestClient
    settings: Settings
    admin: dict[str, str]

    def token(self, grants: list[dict[str, str]], *, is_agent: bool = False,
              name: str = "t") -> dict[str, str]:
        r = self.client.post("/v1/tokens", headers=self.admin,
                             json={"name": name, "grants": grants, "is_agent": is_agent})
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}


def push_dir(client: Any, headers: dict[str, str], ns: str, h_base: str,
             adapter: Path) -> httpx.Response:
    files = {name: (name, (adapter / name).read_bytes(), "application/octet-stream")
             for name in ("adapter_config.json", "adapter_model.safetensors")}
    response: httpx.Response = client.post(f"/v1/namespaces/{ns}/artifacts", headers=headers,
                                           data={"base": h_base}, files=files)
    return response


def setup_namespace(api: Api, abi: dict[str, Any], ns: str = "acme") -> None:
    """Register the base `abi` (idempotent) and create namespace `ns`."""
    r = api.client.post("/v1/bases", headers=api.admin, json={"name": "tiny", "abi": abi})
    assert r.status_code in (200, 201), r.text
    r = api.client.post("/v1/namespaces", headers=api.admin, json={"name": ns})
    assert r.status_code == 201, r.text


# ---------------------------------------------------------------- live HTTP


class LiveServer:
    """uvicorn serving an app on a free loopback port in a background thread."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_for(lambda: self.server.started, what="uvicorn start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def wait_for(predicate: Callable[[], Any], *, what: str, timeout: float = 60.0,
             interval: float = 0.05) -> Any:
    """Poll until `predicate()` is truthy; fail (not a timing assertion) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(interval)


def poll_across(api: Api, token: str, agent_id: int, epoch: int,
                change: Callable[[], None], wait_s: float = 30.0
                ) -> tuple[Any, Any, float]:
    """An agent's own client long-polls desired state (`since` and `tenants_after` at
    its first answer) over real HTTP while `change` runs on this thread once the poll
    waits. Returns (first answer, the poll's answer, seconds the poll took); the poll
    must still be waiting when `change` starts."""
    from agent.sync import ControlPlaneClient

    with LiveServer(api.app) as server:
        client = ControlPlaneClient(server.url, token)
        try:
            first = client.desired_state(agent_id, epoch, after=-1, wait_s=0)
            answers: list[Any] = []
            polled = threading.Event()

            def poll() -> None:
                polled.set()
                answers.append(client.desired_state(
                    agent_id, epoch, after=first.version, wait_s=wait_s,
                    since=first.version, tenants_after=first.tenants_version))

            waiter = threading.Thread(target=poll, daemon=True)
            started = time.monotonic()
            waiter.start()
            polled.wait(5)
            time.sleep(0.3)  # let the request reach its wait
            assert not answers  # nothing changed yet: still waiting
            change()
            waiter.join(timeout=wait_s + 10)
            elapsed = time.monotonic() - started
        finally:
            client.close()
    (answer,) = answers
    return first, answer, elapsed


def non_global_admins(api: Api, ns: str = "acme") -> dict[str, dict[str, str]]:
    """Headers of every kind of token short of admin on '*' (fleet-wide changes such as
    a namespace weight or an alias's hot mark are refused to each): reader, publisher and
    admin of `ns`, publisher on '*', an agent."""
    return {
        "reader": api.token([{"namespace": ns, "role": "read"}], name="reader"),
        "publisher": api.token([{"namespace": ns, "role": "publish"}], name="publisher"),
        "namespace admin": api.token([{"namespace": ns, "role": "admin"}], name="ns-admin"),
        "global publisher": api.token([{"namespace": "*", "role": "publish"}], name="glob"),
        "agent": api.token([], is_agent=True, name="agent"),
    }
