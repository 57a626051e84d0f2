"""Create namespaces (unique names, audited) and set their tenant policy.

A namespace is also the *tenant* of every agent's engine scheduler: its `weight` and
`priority` class reach agents in desired state (`DesiredState.tenants`). Each change
bumps the namespace's `policy_revision` (and so `tenants_version`, the sum over all
namespaces, that long-polling agents wait on) and NOTIFYs the catalog channel, so an
agent applies it within a fraction of a second. A hot-mark change of one of the
namespace's aliases (controlplane/catalog/hot.py) bumps the same revision, because it
moves placement's `prefetch` without a new generation.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.audit.service import record_audit
from controlplane.catalog.service import CATALOG_CHANNEL
from controlplane.db import begin_write
from controlplane.errors import AlreadyExists, BadRequest
from controlplane.models import Namespace
from controlplane.models.namespace import MAX_WEIGHT, PRIORITIES
from controlplane.namespaces.repository import NamespaceRepository


def create_namespace(session: Session, *, name: str, actor: str) -> Namespace:
    begin_write(session)
    repo = NamespaceRepository(session)
    if repo.by_name(name) is not None:
        raise AlreadyExists(f"namespace {name!r} exists", detail={"namespace": name})
    namespace = Namespace(name=name)
    try:
        repo.add(namespace)
        record_audit(session, actor=actor, action="namespace.create", namespace=name,
                     target=f"namespace:{name}")
        session.commit()  # revision 1: waiting agents see it within a re-check, no NOTIFY
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"namespace {name!r} exists", detail={"namespace": name}) from exc
    return namespace


def check_policy(weight: float | None, priority: str | None) -> None:
    """VALIDATION_ERROR unless at least one is given, `0 < weight <= 1000` (finite) and
    `priority` is a priority class (the API schema checks the same before this)."""
    if weight is None and priority is None:
        raise BadRequest("give at least one of 'weight', 'priority'")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)
                               or not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT):
        raise BadRequest(f"weight must be a finite number in (0, {MAX_WEIGHT:g}]",
                         detail={"weight": str(weight)})
    if priority is not None and priority not in PRIORITIES:
        raise BadRequest(f"priority must be one of {', '.join(PRIORITIES)}",
                         detail={"priority": str(priority)})


def set_policy(session: Session, *, name: str, actor: str, weight: float | None = None,
               priority: str | None = None) -> Namespace:
    """Set the namespace's scheduling weight and/or priority class. Audited (before and
    after); bumps its policy revision when a value changes. Commits; bad input or an
    unknown namespace (404) changes nothing."""
    check_policy(weight, priority)
    begin_write(session)
    namespace = NamespaceRepository(session).lock_by_name(name)
    before: dict[str, Any] = {"weight": namespace.weight, "priority": namespace.priority}
    if weight is not None:
        namespace.weight = float(weight)
    if priority is not None:
        namespace.priority = priority
    after: dict[str, Any] = {"weight": namespace.weight, "priority": namespace.priority}
    if after != before:
        bump_policy_revision(session, namespace)
    record_audit(session, actor=actor, action="namespace.update", namespace=name,
                 target=f"namespace:{name}", detail={"before": before, "after": after})
    session.commit()
    return namespace


def tenants_version(session: Session) -> int:
    """Tenant-policy change counter: the sum of every namespace's policy revision (each
    is 1 at creation and only grows with weight, priority and alias hot-mark changes,
    and namespaces are never deleted)."""
    return int(session.scalar(select(func.coalesce(func.sum(Namespace.policy_revision), 0)))
               or 0)


def bump_policy_revision(session: Session, namespace: Namespace) -> None:
    """A change of what agents apply for `namespace` (its scheduling policy, an alias's hot
    mark): the next revision, NOTIFYd at commit so waiting agents re-read desired state."""
    namespace.policy_revision += 1
    notify_policy_change(session, namespace.name, namespace.policy_revision)


def notify_policy_change(session: Session, namespace: str, revision: int) -> None:
    """Queue a NOTIFY on the catalog channel (delivered at commit) so agents' long-polls
    re-read desired state at once (after a policy or hot-mark change). No-op on SQLite
    (waiters poll there)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    payload = json.dumps({"namespace": namespace, "policy_revision": revision},
                         sort_keys=True)
    session.execute(select(func.pg_notify(CATALOG_CHANNEL, payload)))
