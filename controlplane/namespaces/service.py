"""Create namespaces (unique names, audited)."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.audit.service import record_audit
from controlplane.db import begin_write
from controlplane.errors import AlreadyExists
from controlplane.models import Namespace
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
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"namespace {name!r} exists", detail={"namespace": name}) from exc
    return namespace
