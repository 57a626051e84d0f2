"""The console's start page: the namespaces the token may read, with its role in each."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.auth.scopes import Principal, Role
from controlplane.models import Alias, Artifact, Namespace


@dataclass(frozen=True)
class NamespaceRow:
    name: str
    role: Role
    aliases: int
    artifacts: int


def readable_namespaces(session: Session, principal: Principal) -> list[NamespaceRow]:
    """Published aliases and artifacts are counted per namespace (two grouped counts)."""
    aliases = dict(session.execute(
        select(Alias.namespace_id, func.count()).where(Alias.current_generation > 0)
        .group_by(Alias.namespace_id)).tuples().all())
    artifacts = dict(session.execute(
        select(Artifact.namespace_id, func.count()).group_by(Artifact.namespace_id))
        .tuples().all())
    rows = []
    for ns in session.scalars(select(Namespace).order_by(Namespace.name)):
        role = principal.role_in(ns.name)
        if role is not None:
            rows.append(NamespaceRow(ns.name, role, aliases.get(ns.id, 0),
                                     artifacts.get(ns.id, 0)))
    return rows
