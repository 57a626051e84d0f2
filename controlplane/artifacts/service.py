"""Push an artifact: stream its files into content-addressed blobs, then insert one
`pending` row (with its audit row) and send the validation job after commit.

Bytes are written before the row: a failed request can leave unreferenced blobs
(content-addressed, harmless, collectable) but never a row without bytes. Each blob is
leased before the store is asked whether it already holds it (controlplane/retention),
so blob GC never removes a blob between this check and the row's commit. Pushing the
same files for the same base into the same namespace returns the existing artifact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import IO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.artifacts.repository import ArtifactRepository
from controlplane.audit.service import record_audit
from controlplane.bases.repository import BaseModelRepository
from controlplane.config import Settings
from controlplane.db import begin_write
from controlplane.errors import ArtifactTooLarge, BadRequest, StorageUnavailable
from controlplane.models import Artifact, ArtifactState
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.retention.leases import session_lease
from controlplane.storage import (
    ADAPTER_FILES,
    BlobClaim,
    BlobRef,
    BlobTooLarge,
    ObjectStore,
    StorageError,
)
from controlplane.worker.jobs import JobQueue

VALIDATE_TASK = "adapterplane.validate_artifact"
MANIFEST_FORMAT = "adapterplane.peft-dir/v1"


def push_artifact(
    session: Session,
    store: ObjectStore,
    jobs: JobQueue,
    settings: Settings,
    *,
    namespace: str,
    h_base: str,
    files: Mapping[str, IO[bytes]],
    actor: str,
    source: str,
) -> tuple[Artifact, bool]:
    """Return `(artifact, created)`. `files` maps each name in ADAPTER_FILES to a stream."""
    if sorted(files) != sorted(ADAPTER_FILES):
        raise BadRequest(f"an artifact is exactly the files {list(ADAPTER_FILES)}",
                         detail={"files": sorted(files)})
    namespace_id = NamespaceRepository(session).get_by_name(namespace).id
    base_id = BaseModelRepository(session).get_by_h_base(h_base).id
    session.rollback()  # no transaction stays open while bytes move

    lease = session_lease(session)
    blobs = _store_blobs(store, files, settings.max_artifact_bytes, lease)
    manifest = json.dumps(
        {"format": MANIFEST_FORMAT,
         "files": {n: {"sha256": b.sha256, "size": b.size} for n, b in blobs.items()}},
        sort_keys=True, separators=(",", ":")).encode()
    try:
        manifest_ref = store.put_blob_bytes(manifest, claim=lease)
    except StorageError as exc:
        raise StorageUnavailable(str(exc)) from exc
    upload_sha256 = hashlib.sha256(manifest).hexdigest()

    begin_write(session)
    repo = ArtifactRepository(session)
    existing = repo.by_upload(namespace_id, base_id, upload_sha256)
    if existing is not None:
        _resend_if_unfinished(session, jobs, existing)
        session.commit()
        return existing, False
    artifact = Artifact(
        namespace_id=namespace_id, base_id=base_id, upload_sha256=upload_sha256,
        storage_key=manifest_ref.key,
        files={n: {"sha256": b.sha256, "size": b.size, "key": b.key} for n, b in blobs.items()},
        size_bytes=sum(b.size for b in blobs.values()), created_by=actor,
        state=ArtifactState.PENDING.value, validation_attempts=0,
    )
    try:
        repo.add(artifact)
        record_audit(session, actor=actor, action="artifact.push", namespace=namespace,
                     target=f"artifact:{artifact.id}",
                     detail={"upload_sha256": upload_sha256, "base": h_base, "source": source,
                             "size_bytes": artifact.size_bytes})
        jobs.enqueue(session, VALIDATE_TASK, artifact.id)
        session.commit()
    except IntegrityError:  # the same upload raced us and won
        session.rollback()
        winner = ArtifactRepository(session).by_upload(namespace_id, base_id, upload_sha256)
        if winner is None:
            raise
        return winner, False
    return artifact, True


def _store_blobs(store: ObjectStore, files: Mapping[str, IO[bytes]],
                 max_bytes: int, lease: BlobClaim) -> dict[str, BlobRef]:
    blobs: dict[str, BlobRef] = {}
    remaining = max_bytes
    for name in ADAPTER_FILES:
        try:
            blobs[name] = store.put_blob(files[name], max_bytes=remaining, claim=lease)
        except BlobTooLarge as exc:
            raise ArtifactTooLarge(f"artifact exceeds {max_bytes} bytes",
                                   detail={"limit_bytes": max_bytes, "file": name}) from exc
        except StorageError as exc:
            raise StorageUnavailable(f"object storage failed: {exc}",
                                     detail={"file": name}) from exc
        remaining -= blobs[name].size
    return blobs


def _resend_if_unfinished(session: Session, jobs: JobQueue, artifact: Artifact) -> None:
    """A re-push of bytes whose validation never finished (lost job, retries exhausted)
    sends the job again; the job is idempotent, so duplicates are harmless."""
    if artifact.state in (ArtifactState.PENDING.value, ArtifactState.VALIDATING.value):
        jobs.enqueue(session, VALIDATE_TASK, artifact.id)
