"""Materialize one fitted member as an ordinary artifact (rank-R PEFT LoRA, scale 1).

The bundle is fetched digest-checked and re-verified (`read_bundle` re-derives every basis,
core and H_collection digest) before the member is written; the member then goes through
the normal push path (blobs, a `pending` artifact, the validation job), so it is published
and served like any adapter. Pushing the same member twice returns the same artifact.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.artifacts.service import push_artifact
from controlplane.collections.repository import CollectionRepository
from controlplane.config import Settings
from controlplane.errors import BadRequest, InvalidState, StorageUnavailable
from controlplane.models import Artifact, CollectionMember, CollectionState
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.storage import ADAPTER_FILES, ObjectStore, StorageError
from controlplane.worker.jobs import JobQueue


def materialize_member(session: Session, store: ObjectStore, jobs: JobQueue,
                       settings: Settings, *, namespace: str, ref: str, index: int,
                       dtype: str, actor: str) -> tuple[Artifact, bool]:
    from dataplane.collections import CollectionError, read_bundle
    from dataplane.collections.member_peft import DTYPES, write_member_peft

    ns = NamespaceRepository(session).get_by_name(namespace)
    collection = CollectionRepository(session).get_by_ref(ns.id, ref)
    if collection.state != CollectionState.FITTED.value:
        raise InvalidState(f"collection {ref} is {collection.state}, not fitted",
                           detail={"collection": ref, "state": collection.state})
    if not 0 <= index < len(collection.sources):
        raise BadRequest("member index out of range",
                         detail={"index": index, "members": len(collection.sources)})
    if dtype not in DTYPES:
        raise BadRequest(f"dtype must be one of {sorted(DTYPES)}", detail={"dtype": dtype})
    files, cid, h_base = dict(collection.files or {}), collection.id, collection.base.h_base
    session.rollback()  # no transaction stays open while bytes move
    with tempfile.TemporaryDirectory(prefix=f"adapterplane-member-{cid}-") as tmp:
        bundle_dir, member_dir = Path(tmp) / "bundle", Path(tmp) / "member"
        bundle_dir.mkdir()
        try:
            for name, blob in sorted(files.items()):
                store.get_blob(blob["key"], bundle_dir / name, expected_sha256=blob["sha256"])
        except StorageError as exc:
            raise StorageUnavailable(f"collection bundle could not be read: {exc}") from exc
        try:
            bundle = read_bundle(bundle_dir)
        except CollectionError as exc:
            raise InvalidState(exc.message, detail={"collection": ref}) from exc
        write_member_peft(bundle, index, member_dir, dtype)
        handles = {name: (member_dir / name).open("rb") for name in ADAPTER_FILES}
        try:
            artifact, created = push_artifact(
                session, store, jobs, settings, namespace=namespace, h_base=h_base,
                files=handles, actor=actor, source=f"collection:{cid}/member:{index}")
        finally:
            for handle in handles.values():
                handle.close()
    _link(session, cid, index, artifact.id)
    return artifact, created


def _link(session: Session, collection_id: int, index: int, artifact_id: int) -> None:
    """Record that `artifact_id` materialises member `index` (once; a concurrent push of
    the same member links the same artifact, so losing the race changes nothing)."""
    found = session.scalar(select(CollectionMember).where(
        CollectionMember.collection_id == collection_id, CollectionMember.member_index == index))
    if found is not None:
        return
    session.add(CollectionMember(collection_id=collection_id, member_index=index,
                                 artifact_id=artifact_id))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
