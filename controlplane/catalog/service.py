"""Publish, retire, rollback: each appends one generation (resolve: resolution.py).

Concurrency: every writer locks the alias row (`SELECT ... FOR UPDATE` on Postgres;
`BEGIN IMMEDIATE` serialises SQLite), compares `expected_generation` with
`aliases.current_generation`, then bumps it and inserts generation N+1 with its audit
row in the same transaction. Concurrent writers with the same expectation therefore
see exactly one success; the rest get 409 GENERATION_CONFLICT. The unique
`(alias_id, generation)` constraint is a backstop that turns any missed race into a
409 as well, so generations are gapless and never fork.

Idempotency: a request with an `Idempotency-Key` stores the key and a digest of its
body on the generation it created. Repeating the key with the same body returns that
generation (created=False, HTTP 200) even after the alias moved on; with a different
body it fails with 422 IDEMPOTENCY_MISMATCH. Keys are scoped to the alias.

Targets: a publish names an adapter (`artifact_ref`) or a merged release (`release_ref`)
made from the alias's base (BASE_MISMATCH otherwise; a release must be `merged`). A
rollback restores an earlier generation's target, whichever kind it is: moving an alias
from a release back to its adapter is a new generation pointing at the adapter again,
never an unmerge.

Publish verifies the target's bytes first (`verify_artifact_blobs`, outside any
transaction and before the alias lock): a blob that is missing or no longer matches its
recorded size and SHA-256 fails the publish with 409 ARTIFACT_CORRUPT and nothing is
written. The generation then names the verified artifact or release by id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.artifacts.repository import ArtifactRepository
from controlplane.audit.service import record_audit
from controlplane.catalog.repository import AliasRepository, GenerationRepository
from controlplane.db import begin_write
from controlplane.errors import (
    ArtifactCorrupt,
    BaseMismatch,
    GenerationConflict,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StorageUnavailable,
)
from controlplane.merges.repository import MergeRepository
from controlplane.models import (
    Alias,
    Artifact,
    ArtifactState,
    CatalogAction,
    CatalogGeneration,
    Merge,
    MergeState,
)
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ObjectStore, StorageError


@dataclass(frozen=True)
class CatalogRequest:
    """One publish/retire/rollback as the caller sent it."""

    namespace: str
    alias: str
    action: CatalogAction
    actor: str
    artifact_ref: str | None = None
    expected_generation: int | None = None
    to_generation: int | None = None
    reason: str | None = None
    idempotency_key: str | None = None
    release_ref: str | None = None

    def body_sha256(self) -> str:
        body: dict[str, object] = {
            "action": self.action.value, "artifact": self.artifact_ref,
            "expected_generation": self.expected_generation,
            "to_generation": self.to_generation, "reason": self.reason}
        if self.release_ref is not None:  # absent: digests of adapter publishes unchanged
            body["release"] = self.release_ref
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def apply_change(session: Session, req: CatalogRequest,
                 store: ObjectStore) -> tuple[CatalogGeneration, bool]:
    """Append one generation for `req`; return `(generation, created)`. Commits.

    `store` holds the artifacts' bytes; a publish reads them back (`verify_artifact_blobs`).
    """
    verified_id: int | None = None
    if req.action is CatalogAction.PUBLISH:
        if req.idempotency_key is not None:
            replay = _replay(session, req)  # a replay re-reads nothing
            if replay is not None:
                session.commit()
                return replay, False
        verified_id = (_verified_release_id(session, store, req) if req.release_ref is not None
                       else _verified_artifact_id(session, store, req))
    try:
        return _apply(session, req, verified_id)
    except IntegrityError as exc:
        session.rollback()
        if req.idempotency_key is not None:
            replay = _replay(session, req)
            if replay is not None:
                return replay, False
        raise GenerationConflict("the alias changed concurrently; re-read and retry",
                                 detail={"namespace": req.namespace, "alias": req.alias}) from exc


def _apply(session: Session, req: CatalogRequest,
           verified_id: int | None) -> tuple[CatalogGeneration, bool]:
    begin_write(session)
    namespace = NamespaceRepository(session).get_by_name(req.namespace)
    aliases = AliasRepository(session)
    published: Artifact | Merge | None = None
    if req.action is CatalogAction.PUBLISH:
        if req.release_ref is not None:
            ref = str(verified_id) if verified_id is not None else req.release_ref
            published = _publishable_release(session, namespace.id, ref)
        else:
            ref = str(verified_id) if verified_id is not None else req.artifact_ref or ""
            published = _publishable(session, namespace.id, ref)
        aliases.ensure(namespace.id, req.alias, published.base_id)
    alias = aliases.lock(namespace.id, req.alias)
    if alias is None or (alias.current_generation == 0 and req.action is not CatalogAction.PUBLISH):
        raise NotFound(f"alias {req.namespace}/{req.alias} was never published",
                       detail={"namespace": req.namespace, "alias": req.alias})
    if req.idempotency_key is not None:
        replay = _check_idempotency(session, alias, req)
        if replay is not None:
            session.commit()
            return replay, False
    if req.expected_generation is not None and req.expected_generation != (
        alias.current_generation
    ):
        raise GenerationConflict(
            f"expected generation {req.expected_generation}, current is "
            f"{alias.current_generation}",
            detail={"namespace": req.namespace, "alias": req.alias,
                    "expected_generation": req.expected_generation,
                    "current_generation": alias.current_generation})
    generations = GenerationRepository(session)
    current = generations.get(alias.id, alias.current_generation)
    artifact_id, merge_id = _target(generations, alias, current, published, req)
    alias.current_generation += 1
    row = CatalogGeneration(
        alias_id=alias.id, generation=alias.current_generation, action=req.action.value,
        artifact_id=artifact_id, merge_id=merge_id, actor=req.actor, reason=req.reason,
        idempotency_key=req.idempotency_key,
        request_sha256=req.body_sha256() if req.idempotency_key is not None else None)
    generations.add(row)
    record_audit(session, actor=req.actor, action=f"catalog.{req.action.value}",
                 namespace=req.namespace, target=f"alias:{req.namespace}/{req.alias}",
                 detail={"generation": row.generation, "artifact_id": artifact_id,
                         "merge_id": merge_id, "reason": req.reason})
    notify_catalog_change(session, req.namespace, req.alias, row.generation)
    session.commit()
    return row, True


CATALOG_CHANNEL = "adapterplane_catalog"
"""Postgres NOTIFY channel that wakes agents' long-polls; payload (JSON)
`{"namespace","alias","generation"}` for a catalog change, `{"namespace",
"policy_revision"}` for a tenant-policy or alias hot-mark change
(controlplane/namespaces/service.py)."""


def notify_catalog_change(session: Session, namespace: str, alias: str, generation: int) -> None:
    """Queue a NOTIFY that Postgres delivers only if and when this transaction commits,
    so listeners (agents) learn of a new generation at once. No-op on SQLite."""
    if session.get_bind().dialect.name != "postgresql":
        return
    payload = json.dumps({"namespace": namespace, "alias": alias, "generation": generation},
                         sort_keys=True)
    session.execute(select(func.pg_notify(CATALOG_CHANNEL, payload)))


def _verified_artifact_id(session: Session, store: ObjectStore,
                          req: CatalogRequest) -> int | None:
    """Resolve the publish's artifact and verify its blobs; None when it is not validated
    (`_apply` then refuses it with INVALID_STATE). No transaction stays open meanwhile."""
    namespace = NamespaceRepository(session).get_by_name(req.namespace)
    artifact = ArtifactRepository(session).get_by_ref(namespace.id, req.artifact_ref or "",
                                                      lean=True, with_files=True)
    artifact_id, state, files = artifact.id, artifact.state, dict(artifact.files)
    session.rollback()
    if state != ArtifactState.VALIDATED.value:
        return None
    verify_artifact_blobs(store, artifact_id, files)
    return artifact_id


def _verified_release_id(session: Session, store: ObjectStore,
                         req: CatalogRequest) -> int | None:
    """`_verified_artifact_id` for a merged release: every checkpoint file is re-read."""
    namespace = NamespaceRepository(session).get_by_name(req.namespace)
    merge = MergeRepository(session).get_by_ref(namespace.id, req.release_ref or "")
    merge_id, state, files = merge.id, merge.state, dict(merge.files or {})
    session.rollback()
    if state != MergeState.MERGED.value:
        return None
    verify_artifact_blobs(store, merge_id, files, noun="release")
    return merge_id


def verify_artifact_blobs(store: ObjectStore, artifact_id: int,
                          files: dict[str, dict[str, object]], *, noun: str = "artifact") -> None:
    """Raise ARTIFACT_CORRUPT unless every file's blob has its recorded size and SHA-256.

    Cost: per blob one size lookup (stat / S3 HEAD) and one full read of its bytes (in
    place on the file store, one download on S3), i.e. the artifact's size read once
    per publish. A storage failure is STORAGE_ERROR (502): nothing is published."""
    for name, ref in sorted(files.items()):
        sha256, size, key = str(ref["sha256"]), int(str(ref["size"])), str(ref["key"])
        try:
            fault = store.blob_fault(sha256, size, key)
        except StorageError as exc:
            raise StorageUnavailable(f"object storage failed while verifying {name}: {exc}",
                                     detail={f"{noun}_id": artifact_id, "file": name}) from exc
        if fault is not None:
            repair = ("push the same files again to repair it" if noun == "artifact"
                      else "run the same merge again to repair it")
            raise ArtifactCorrupt(
                f"{noun} {artifact_id}: stored {name} is corrupt ({fault}); {repair}",
                detail={f"{noun}_id": artifact_id, "file": name, "key": key, "fault": fault})


def _publishable(session: Session, namespace_id: int, ref: str) -> Artifact:
    artifact = ArtifactRepository(session).get_by_ref(namespace_id, ref, lean=True)
    if artifact.state != ArtifactState.VALIDATED.value:
        raise InvalidState(f"artifact {artifact.id} is {artifact.state}, not validated",
                           detail={"artifact_id": artifact.id, "state": artifact.state})
    return artifact


def _publishable_release(session: Session, namespace_id: int, ref: str) -> Merge:
    merge = MergeRepository(session).get_by_ref(namespace_id, ref)
    if merge.state != MergeState.MERGED.value:
        raise InvalidState(f"merge {merge.id} is {merge.state}, not merged",
                           detail={"merge_id": merge.id, "state": merge.state})
    return merge


Target = tuple[int | None, int | None]
"""(artifact_id, merge_id) of a generation; (None, None): retired."""


def _target(generations: GenerationRepository, alias: Alias, current: CatalogGeneration | None,
            published: Artifact | Merge | None, req: CatalogRequest) -> Target:
    where = {"namespace": req.namespace, "alias": req.alias}
    if req.action is CatalogAction.PUBLISH:
        assert published is not None  # set by _apply for publish
        if published.base_id != alias.base_id:
            noun, key = (("artifact's", "artifact_base") if isinstance(published, Artifact)
                         else ("release's source", "release_source_base"))
            raise BaseMismatch(f"the {noun} base differs from the alias's base",
                               detail={**where, key: published.base.h_base,
                                       "alias_base": alias.base.h_base})
        if isinstance(published, Artifact):
            return published.id, None
        return None, published.id
    if req.action is CatalogAction.RETIRE:
        if current is not None and current.target == (None, None):
            raise InvalidState("the alias is already retired",
                               detail={**where, "generation": current.generation})
        return None, None
    current_target = current.target if current is not None else (None, None)
    if req.to_generation is not None:
        target = generations.get(alias.id, req.to_generation)
        if target is None or req.to_generation >= alias.current_generation:
            raise NotFound(f"no earlier generation {req.to_generation}",
                           detail={**where, "to_generation": req.to_generation})
        if target.target == (None, None):
            raise InvalidState(f"generation {req.to_generation} is a retire",
                               detail={**where, "to_generation": req.to_generation})
        return target.target
    previous = generations.previous_target(alias.id, alias.current_generation, current_target)
    if previous is None:
        raise InvalidState("nothing to roll back to", detail=where)
    return previous.target


def _check_idempotency(session: Session, alias: Alias,
                       req: CatalogRequest) -> CatalogGeneration | None:
    assert req.idempotency_key is not None
    found = GenerationRepository(session).by_idempotency_key(alias.id, req.idempotency_key)
    if found is None:
        return None
    if found.request_sha256 != req.body_sha256() or found.action != req.action.value:
        raise IdempotencyMismatch("Idempotency-Key reused with a different request",
                                  detail={"idempotency_key": req.idempotency_key,
                                          "generation": found.generation})
    return found


def _replay(session: Session, req: CatalogRequest) -> CatalogGeneration | None:
    namespace = NamespaceRepository(session).by_name(req.namespace)
    alias = AliasRepository(session).by_name(namespace.id, req.alias) if namespace else None
    if alias is None:
        return None
    return _check_idempotency(session, alias, req)

