"""Collection pages: a namespace's collections with each member's fit error.

A fitted (or release-refused) collection's `metrics.relative_error[i]` is member i's
relative Frobenius reconstruction error; the release threshold is the spec's
`max_relative_error`, so a member over it is the reason a collection was refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.auth.scopes import Principal, Role
from controlplane.collections.convert import collection_out
from controlplane.collections.schemas import CollectionOut
from controlplane.kit.pagination import PageParams, paginate
from controlplane.models import Collection
from controlplane.namespaces.repository import NamespaceRepository


@dataclass(frozen=True)
class MemberRow:
    index: int
    artifact_id: int
    digest: str
    cluster: int | None
    relative_error: float | None
    over_threshold: bool


@dataclass(frozen=True)
class CollectionRow:
    collection: CollectionOut
    members: list[MemberRow]


@dataclass(frozen=True)
class CollectionList:
    namespace: str
    items: list[CollectionRow]
    next_cursor: str | None


def member_rows(out: CollectionOut) -> list[MemberRow]:
    metrics = out.metrics or {}
    errors = metrics.get("relative_error")
    errors = errors if isinstance(errors, list) and len(errors) == len(out.sources) else None
    threshold = Fraction(str(out.spec.get("max_relative_error", "1")))
    rows = []
    for i, source in enumerate(out.sources):
        error = float(errors[i]) if errors is not None else None
        if error is not None and not math.isfinite(error):
            error = None
        cluster = out.assignment[i] if out.assignment and len(out.assignment) > i else None
        rows.append(MemberRow(i, source.artifact_id, source.digest, cluster, error,
                              error is not None and Fraction(error) > threshold))
    return rows


def collection_list(session: Session, principal: Principal, namespace: str,
                    params: PageParams) -> CollectionList:
    principal.require(namespace, Role.READ)
    ns = NamespaceRepository(session).get_by_name(namespace)
    page = paginate(session, select(Collection).where(Collection.namespace_id == ns.id),
                    key=Collection.id, params=params, descending=True)
    outs = [collection_out(c) for c in page.items]
    return CollectionList(namespace, [CollectionRow(o, member_rows(o)) for o in outs],
                          page.next_cursor)
