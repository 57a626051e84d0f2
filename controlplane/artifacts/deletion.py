"""Delete an artifact row that nothing names; its blobs are left to garbage collection.

Allowed for an artifact that was never published and is no collection's (or other
row's) source: pending, validating, validated-but-unused and rejected ones. Refused
with 409 ARTIFACT_REFERENCED, changing nothing, while anything references it:

- a foreign key to `artifacts.id` (catalog generations, current *or* historical, since
  history must stay resolvable for rollback; collection member links; any later table
  is found from the schema);
- a JSON list of `{"artifact_id", ...}` in an `ARTIFACT_LIST_COLUMNS` column (a
  collection's `sources`, a merge's `adapters`), read in the namespace.

The row is locked first, so a publish that names it concurrently waits and then fails
its foreign-key check rather than pointing a generation at a deleted row. Blobs are
not touched here: a content-addressed blob may be shared with another artifact, so only
blob GC (controlplane/retention) decides, once no row references it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.artifacts.repository import ArtifactRepository
from controlplane.audit.service import record_audit
from controlplane.db import begin_write
from controlplane.errors import ArtifactReferenced, NotFound
from controlplane.models import Artifact, Base
from controlplane.namespaces.repository import NamespaceRepository

ARTIFACT_LIST_COLUMNS = ("sources", "adapters")
"""JSON columns holding ordered `[{"artifact_id": int, ...}]` lists of source artifacts."""
SHOWN = 20
"""At most this many referencing rows are named in the error's detail (all are counted)."""


def delete_artifact(session: Session, *, namespace: str, ref: str, actor: str) -> Artifact:
    """Delete the artifact `ref` of `namespace` with its audit row (`artifact.delete`),
    committed; return the deleted row as it was."""
    begin_write(session)
    ns = NamespaceRepository(session).get_by_name(namespace)
    found = ArtifactRepository(session).get_by_ref(ns.id, ref, lean=True)
    session.expunge(found)  # reloaded whole, under the lock
    artifact = session.scalars(select(Artifact).where(Artifact.id == found.id)
                               .with_for_update(of=Artifact)).unique().one_or_none()
    if artifact is None:  # deleted between the lookup and the lock
        raise NotFound(f"artifact not found: {ref}", detail={"kind": "artifact", "ref": ref})
    references = _foreign_keys(session, artifact.id) + _source_lists(session, artifact)
    if references:
        raise ArtifactReferenced(
            f"artifact {artifact.id} is referenced by {len(references)} row(s); "
            "it cannot be deleted",
            detail={"artifact_id": artifact.id, "references": references[:SHOWN],
                    "count": len(references)})
    record_audit(session, actor=actor, action="artifact.delete", namespace=namespace,
                 target=f"artifact:{artifact.id}",
                 detail={"state": artifact.state, "digest": artifact.digest,
                         "upload_sha256": artifact.upload_sha256,
                         "size_bytes": artifact.size_bytes})
    session.delete(artifact)
    session.commit()
    return artifact


def _foreign_keys(session: Session, artifact_id: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for table in Base.metadata.sorted_tables:
        for fk in table.foreign_keys:
            if fk.column.table.name != Artifact.__tablename__ or fk.column.name != "id":
                continue
            rows = session.scalars(select(table.c.id).where(fk.parent == artifact_id)
                                   .order_by(table.c.id))
            found += [{"table": table.name, "id": row} for row in rows]
    return found


def _source_lists(session: Session, artifact: Artifact) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for mapper in Base.registry.mappers:
        model = mapper.class_
        columns = mapper.columns.keys()
        for name in ARTIFACT_LIST_COLUMNS:
            if name not in columns or "namespace_id" not in columns:
                continue
            column = getattr(model, name)
            for row_id, items in session.execute(
                    select(model.id, column).where(model.namespace_id == artifact.namespace_id)):
                if any(isinstance(item, dict) and item.get("artifact_id") == artifact.id
                       for item in items or []):
                    found.append({"table": model.__tablename__, "id": row_id})
    return found
