"""HTTP client of the control plane (httpx), as the agent uses it.

Agent-token calls: register (fresh worker epoch), heartbeat (slot report), desired
state (long-poll), the registered name of the agent's base model, the merged release
the agent's name is assigned, the download URLs of a merged base's checkpoint. Client-token calls:
`can_read` asks the control plane whether a client's bearer token may read a namespace,
cached for `auth_cache_s` per (token digest, namespace) so the hot path does not hit the
control plane on every request; a refusal is cached too, a revoked token stops working
within that TTL. While the control plane cannot answer (no connection, 5xx), a cached
answer up to `auth_stale_s` past its TTL is used instead (stale-while-revalidate), so a
short control-plane outage does not fail requests of callers seen recently; anyone else
gets :class:`ControlPlaneError` (the server answers 503 with `Retry-After`).

Connections are kept alive and reused; a connect failure is retried by the transport,
and an idempotent GET whose reused connection was reset is retried on a fresh one
(`GET_ATTEMPTS`).

Bodies and answers are the shared wire models of `controlplane.contracts` (the only
control-plane module the agent may import): every answer is validated into its model,
and one that does not fit raises :class:`ControlPlaneError` like a failed call.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, RootModel, ValidationError

from controlplane.contracts import (
    AgentOut,
    BaseCheckpoint,
    DesiredAlias,
    DesiredState,
    HeartbeatOut,
    HeartbeatRequest,
    RegisterRequest,
)

M = TypeVar("M", bound=BaseModel)

GET_ATTEMPTS = 3
"""Tries of an idempotent GET whose connection failed (reset, refused, timed out)."""
RETRY_PAUSE_S = 0.05
"""Pause before the second try; doubled before each later one."""


class RegisteredBase(BaseModel):
    """The part of the admin API's `GET /v1/bases/{h_base}` answer the agent reads: the
    name the base model was registered under (what requests name it by)."""

    name: str


class AgentList(RootModel[list[AgentOut]]):
    """`GET /v1/agents?name=N`: the agent of that name, or none."""


class ControlPlaneError(Exception):
    """A control-plane call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
        message, code = str(body.get("error", response.text)), str(body.get("code", ""))
    except ValueError:
        message, code = response.text, ""
    raise ControlPlaneError(message, response.status_code, code)


def _answer(response: httpx.Response, answer: type[M], what: str) -> M:
    """The answer validated into its model (ControlPlaneError for a refusal or a misfit)."""
    _raise_for(response)
    try:
        return answer.model_validate_json(response.content)
    except ValidationError as exc:
        raise ControlPlaneError(f"{what}: the answer is not a {answer.__name__}: {exc}",
                                response.status_code) from exc


LEAVE_TIMEOUT_S = 3.0
"""A stopping agent's last calls (drain, final heartbeat) wait at most this long."""


class ControlPlaneClient:
    def __init__(self, base_url: str, token: str, auth_cache_s: float = 5.0,
                 auth_stale_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(10.0),
                                  headers={"Authorization": f"Bearer {token}"},
                                  transport=httpx.HTTPTransport(retries=2))
        self._poll = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0),
                                  headers={"Authorization": f"Bearer {token}"},
                                  transport=httpx.HTTPTransport(retries=2))
        self._auth = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(5.0),
                                  transport=httpx.HTTPTransport(retries=2),
                                  limits=httpx.Limits(max_keepalive_connections=32))
        self.auth_cache_s = auth_cache_s
        self.auth_stale_s = auth_stale_s
        self._auth_cache: dict[tuple[str, str], tuple[float, int]] = {}
        """(token digest, namespace) -> (fresh until, status)."""
        self._lock = threading.Lock()

    def close(self) -> None:
        for client in (self._http, self._poll, self._auth):
            client.close()

    def _call(self, client: httpx.Client, method: str, path: str, answer: type[M],
              **kw: Any) -> M:
        try:
            response = client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ControlPlaneError(f"{method} {path}: {exc}") from exc
        return _answer(response, answer, f"{method} {path}")

    @staticmethod
    def _get(client: httpx.Client, path: str, **kw: Any) -> httpx.Response:
        """An idempotent GET, tried again on a fresh connection after a transport error."""
        pause = RETRY_PAUSE_S
        for attempt in range(GET_ATTEMPTS):
            try:
                return client.get(path, **kw)
            except httpx.HTTPError as exc:
                if attempt == GET_ATTEMPTS - 1:
                    raise ControlPlaneError(f"GET {path}: {exc}") from exc
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")

    def register(self, body: RegisterRequest) -> AgentOut:
        return self._call(self._http, "POST", "/v1/agents/register", AgentOut,
                          json=body.model_dump(mode="json"))

    def heartbeat(self, agent_id: int, body: HeartbeatRequest,
                  timeout: float | None = None) -> HeartbeatOut:
        return self._call(self._http, "POST", f"/v1/agents/{agent_id}/heartbeat", HeartbeatOut,
                          json=body.model_dump(mode="json"),
                          timeout=timeout if timeout is not None else self._http.timeout)

    def drain(self, agent_id: int) -> AgentOut:
        return self._call(self._http, "POST", f"/v1/agents/{agent_id}/drain", AgentOut,
                          timeout=LEAVE_TIMEOUT_S)

    def undrain(self, agent_id: int) -> AgentOut:
        return self._call(self._http, "POST", f"/v1/agents/{agent_id}/undrain", AgentOut,
                          timeout=LEAVE_TIMEOUT_S)

    def assigned_release(self, name: str) -> str | None:
        """H_base of the merged release agent `name` is assigned (None: none, or no agent
        of that name is registered yet)."""
        response = self._get(self._http, "/v1/agents", params={"name": name})
        agents = _answer(response, AgentList, "agent list").root
        for agent in agents:
            if agent.name == name and agent.release is not None:
                return agent.release.base
        return None

    def desired_state(self, agent_id: int, worker_epoch: int, after: int,
                      wait_s: float, since: int = -1,
                      tenants_after: int | None = None) -> DesiredState:
        """Long-poll past catalog version `after` (and, given `tenants_after`, past that
        tenant-policy version too: a namespace weight/priority change also returns it);
        `since` >= 0 asks for the aliases changed after that version only (incremental),
        -1 for the full state."""
        params: dict[str, Any] = {"worker_epoch": worker_epoch, "after": after,
                                  "wait": wait_s, "since": since}
        if tenants_after is not None:
            params["tenants_after"] = tenants_after
        return self._call(self._poll, "GET", f"/v1/agents/{agent_id}/desired-state",
                          DesiredState, params=params)

    def base_name(self, h_base: str) -> str | None:
        """The name `h_base` was registered under (None: no such base is registered)."""
        response = self._get(self._http, f"/v1/bases/{h_base}")
        if response.status_code == 404:
            return None
        return _answer(response, RegisteredBase, "base model").name

    def base_checkpoint(self, h_base: str) -> BaseCheckpoint:
        """Download URLs of the registry's checkpoint of merged base `h_base`."""
        return _answer(self._get(self._http, f"/v1/bases/{h_base}/checkpoint"), BaseCheckpoint,
                       "base checkpoint")

    def pinned_generation(self, agent_id: int, worker_epoch: int, namespace: str, alias: str,
                          generation: int) -> DesiredAlias | None:
        """One generation of an alias at any age (None: the catalog has no such one)."""
        params = {"worker_epoch": worker_epoch, "namespace": namespace, "alias": alias,
                  "generation": generation}
        response = self._get(self._http, f"/v1/agents/{agent_id}/generation", params=params)
        if response.status_code == 404:
            return None
        return _answer(response, DesiredAlias, "pinned generation")

    def cached_read(self, token: str, namespace: str) -> int | None:
        """The fresh cached answer of :meth:`can_read`, None when it must ask (lets an
        event loop skip the thread hop on the hot path)."""
        key = (hashlib.sha256(token.encode()).hexdigest(), namespace)
        with self._lock:
            hit = self._auth_cache.get(key)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def can_read(self, token: str, namespace: str) -> int:
        """HTTP status of the read check: 200 allowed, 401 bad token, 403 no scope."""
        key = (hashlib.sha256(token.encode()).hexdigest(), namespace)
        now = time.monotonic()
        with self._lock:
            hit = self._auth_cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            response = self._get(self._auth, "/v1/agents/authorize",
                                 params={"namespace": namespace},
                                 headers={"Authorization": f"Bearer {token}"})
            status = response.status_code
            if status not in (200, 401, 403):
                _raise_for(response)
        except ControlPlaneError as exc:
            if exc.status not in (0, 500, 502, 503, 504):
                raise
            if hit is not None and hit[0] + self.auth_stale_s > now:
                return hit[1]
            raise
        with self._lock:
            if len(self._auth_cache) > 10_000:
                self._auth_cache.clear()
            self._auth_cache[key] = (now + self.auth_cache_s, status)
        return status
