"""Register base models. H_base is computed here from the ABI record, never trusted."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.artifacts.peft import parse_base_record
from controlplane.audit.service import record_audit
from controlplane.bases.repository import BaseModelRepository
from controlplane.db import begin_write
from controlplane.models import BaseModel


def register_base(session: Session, *, name: str, abi: dict[str, Any],
                  actor: str) -> tuple[BaseModel, bool]:
    """Return `(base, created)`; registering the same H_base again returns the existing row."""
    parsed = parse_base_record(abi)
    repo = BaseModelRepository(session)
    begin_write(session)
    existing = repo.by_h_base(parsed.h_base)
    if existing is not None:
        return existing, False
    base = BaseModel(h_base=parsed.h_base, name=name, architecture=parsed.architecture,
                     abi=parsed.record)
    try:
        repo.add(base)
        record_audit(session, actor=actor, action="base.register", target=f"base:{base.h_base}",
                     detail={"name": name})
        session.commit()
    except IntegrityError:  # a concurrent registration of the same H_base won
        session.rollback()
        return BaseModelRepository(session).get_by_h_base(parsed.h_base), False
    return base, True
