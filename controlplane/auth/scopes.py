"""Principals and the scope rule.

A token holds grants `{namespace, role}`; `namespace == "*"` covers every namespace.
Roles are ordered read < publish < admin and a higher role implies the lower ones.
Agent tokens (`is_agent`) may read every namespace (desired state, resolve) and
nothing more unless granted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from controlplane.errors import Forbidden

ALL_NAMESPACES = "*"


class Role(enum.StrEnum):
    READ = "read"
    PUBLISH = "publish"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return {"read": 1, "publish": 2, "admin": 3}[self.value]


@dataclass(frozen=True)
class Grant:
    namespace: str
    role: Role


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    grants: tuple[Grant, ...]
    is_agent: bool

    @property
    def actor(self) -> str:
        """How this principal appears in audit rows and generations."""
        return f"token:{self.token_id}:{self.name}"

    def role_in(self, namespace: str) -> Role | None:
        best: Role | None = Role.READ if self.is_agent else None
        for grant in self.grants:
            if grant.namespace in (namespace, ALL_NAMESPACES) and (
                best is None or grant.role.rank > best.rank
            ):
                best = grant.role
        return best

    def can(self, namespace: str, role: Role) -> bool:
        held = self.role_in(namespace)
        return held is not None and held.rank >= role.rank

    def can_global(self, role: Role) -> bool:
        """Holds `role` through a `*` grant (agent read counts as global read)."""
        if role is Role.READ and self.is_agent:
            return True
        return any(g.namespace == ALL_NAMESPACES and g.role.rank >= role.rank
                   for g in self.grants)

    def require(self, namespace: str, role: Role) -> None:
        if not self.can(namespace, role):
            raise Forbidden(f"token lacks {role} on namespace {namespace!r}",
                            detail={"namespace": namespace, "required": role.value})

    def require_global(self, role: Role) -> None:
        if not self.can_global(role):
            raise Forbidden(f"token lacks {role} on every namespace ('*')",
                            detail={"namespace": ALL_NAMESPACES, "required": role.value})
