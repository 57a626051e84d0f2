"""Router settings, read from the environment with the prefix `ADAPTERPLANE_ROUTER_`.

A router holds no state of its own beyond a replica of the control plane's routing
state (`GET /v1/fleet/routing`) and a few seconds of local observations, so any number
of replicas run behind a plain load balancer with the same settings.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RouterSettings(BaseSettings):
    """All knobs of one router process."""

    model_config = SettingsConfigDict(env_prefix="ADAPTERPLANE_ROUTER_", extra="ignore",
                                      use_attribute_docstrings=True)

    control_plane_url: str = "http://127.0.0.1:8400"
    """Base URL of the control plane's admin API (routing state, token checks)."""
    token: SecretStr = SecretStr("")
    """A token with read on every namespace (`*`) or an agent token: reads the routing
    state (every alias and agent). Clients' own tokens are what requests are checked and
    forwarded with."""
    host: str = "0.0.0.0"
    """Interface the OpenAI-compatible API listens on."""
    port: int = Field(default=8600, ge=0, le=65535)
    """Port of the OpenAI-compatible API."""
    refresh_s: float = Field(default=0.5, gt=0, le=30)
    """Longest age of the agent table: the routing-state long-poll returns at a catalog
    change at once, and after this long otherwise."""
    max_attempts: int = Field(default=3, ge=1, le=16)
    """Agents tried for one request: a connection failure, a 5xx or a 429 before the
    first byte of the answer moves the request to the next agent."""
    connect_timeout_s: float = Field(default=2.0, gt=0)
    """Time to connect to an agent before trying the next one."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for an agent's next byte (a non-streaming answer comes whole once the
    request finishes, so this bounds a request's run time)."""
    down_s: float = Field(default=2.0, ge=0)
    """An agent that refused or dropped a connection is skipped for this long."""
    cold_mark_s: float = Field(default=30.0, ge=0)
    """After sending a cold adapter to an agent, route its requests there (as if
    resident) for this long or until heartbeats show where it lives."""
    auth_cache_s: float = Field(default=5.0, ge=0)
    """How long a client token's read permission on a namespace is cached."""
    auth_stale_s: float = Field(default=60.0, ge=0)
    """How long past `auth_cache_s` a cached permission still answers while the control
    plane cannot be reached."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body accepted (413 above it)."""
