"""Token request/response bodies."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from controlplane.auth.scopes import Role

NAMESPACE_PATTERN = r"^(\*|[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)$"


class GrantIn(BaseModel):
    namespace: str = Field(pattern=NAMESPACE_PATTERN, description="A namespace or '*'.")
    role: Role


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    grants: list[GrantIn] = Field(default_factory=list, max_length=100)
    is_agent: bool = False


class TokenOut(BaseModel):
    id: int
    name: str
    grants: list[GrantIn]
    is_agent: bool
    revoked: bool
    created_at: datetime


class TokenCreated(BaseModel):
    """The plaintext `token` appears here once and is never stored."""

    id: int
    name: str
    token: str
    grants: list[GrantIn]
    is_agent: bool
