"""The body of the validation job: claim, fetch with digest checks, validate, finish.

Each step runs in its own short transaction on a fresh session, and the job is
idempotent: running it twice, or two runs at once (a redelivered message, the reaper),
validates the artifact once and writes its outcome once:

1. claim: `pending|validating -> validating`, attempts += 1 (row-locked). Artifacts
   already `validated`/`rejected` are left as they are: running the job twice is a no-op.
2. fetch every file from the object store into a temp dir, checking its SHA-256.
   `TransientStorageError` propagates (the Celery task retries it with backoff) after
   `last_error` is recorded; a checksum mismatch or a missing object rejects.
3. validate with `dataplane.artifacts.validate_peft_dir` against the base ABI.
4. finish: `validating -> validated` (digest, method, modules, sizes written once) or
   `-> rejected` (code, message, detail), with an audit row, in one transaction. If
   another run finished first, this one changes nothing.

Duplicate digests: an artifact whose H_artifact equals an already validated one in the
same namespace is still validated on its own (different upload bytes, e.g. re-serialised
JSON, can describe the same adapter). Digests are not unique; `sha256:<digest>` refs
resolve to the oldest validated artifact with that digest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from controlplane.artifacts.peft import Rejected, Validated, validate_adapter_dir
from controlplane.audit.service import record_audit
from controlplane.config import Settings
from controlplane.db import session_scope
from controlplane.models import Artifact, ArtifactState, utcnow
from controlplane.storage import (
    ObjectStore,
)
from controlplane.worker.job_rows import fetch_blobs, locked, record_error

WORKER_ACTOR = "worker:validate_artifact"


def validate_artifact_now(
    artifact_id: int,
    *,
    session_factory: sessionmaker[Session],
    store: ObjectStore,
    settings: Settings,
) -> str | None:
    """Run one validation attempt; return the artifact's state afterwards (None: no row)."""
    claimed = _claim(session_factory, artifact_id)
    if claimed is None or claimed[0] != ArtifactState.VALIDATING.value:
        return None if claimed is None else claimed[0]
    _state, files, base_abi = claimed
    with tempfile.TemporaryDirectory(prefix=f"adapterplane-validate-{artifact_id}-") as tmp:
        fetch_failure = _fetch(session_factory, store, artifact_id, files, Path(tmp))
        try:
            outcome: Validated | Rejected = (
                fetch_failure if fetch_failure is not None
                else validate_adapter_dir(Path(tmp), base_abi, settings))
        except Exception as exc:  # a bug or an environment fault, not a bad artifact
            record_validation_error(session_factory, artifact_id,
                                    f"{type(exc).__name__}: {exc}")
            raise
    return _finish(session_factory, artifact_id, outcome)


def _locked(session: Session, artifact_id: int) -> Artifact | None:
    return locked(session, Artifact, artifact_id)


def _claim(factory: sessionmaker[Session],
           artifact_id: int) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    with session_scope(factory) as session:
        artifact = _locked(session, artifact_id)
        if artifact is None:
            return None
        if artifact.state in (ArtifactState.PENDING.value, ArtifactState.VALIDATING.value):
            artifact.transition(ArtifactState.VALIDATING)
            artifact.validation_attempts += 1
        result = (artifact.state, dict(artifact.files), dict(artifact.base.abi))
        session.commit()
        return result


def _fetch(factory: sessionmaker[Session], store: ObjectStore, artifact_id: int,
           files: dict[str, Any], dest: Path) -> Rejected | None:
    fault = fetch_blobs(store, files, dest, where="", detail={},
                        on_error=lambda m: record_validation_error(factory, artifact_id, m))
    return None if fault is None else Rejected(fault.code, fault.message, fault.detail)


def record_validation_error(factory: sessionmaker[Session], artifact_id: int,
                            message: str) -> None:
    """Note a transient fault on an artifact still `validating` (the job retries)."""
    record_error(factory, Artifact, artifact_id, ArtifactState.VALIDATING.value, message)


def _finish(factory: sessionmaker[Session], artifact_id: int,
            outcome: Validated | Rejected) -> str | None:
    with session_scope(factory) as session:
        artifact = _locked(session, artifact_id)
        if artifact is None:
            return None
        if artifact.state != ArtifactState.VALIDATING.value:
            return artifact.state  # another run finished first
        namespace = artifact.namespace.name
        if isinstance(outcome, Validated):
            artifact.transition(ArtifactState.VALIDATED)
            artifact.digest = outcome.digest
            artifact.method = outcome.method
            artifact.modules = outcome.modules
            artifact.tensor_bytes = outcome.tensor_bytes
            artifact.validated_record = outcome.record
            artifact.validated_at = utcnow()
            artifact.last_error = None
            record_audit(session, actor=WORKER_ACTOR, action="artifact.validated",
                         namespace=namespace, target=f"artifact:{artifact.id}",
                         detail={"digest": outcome.digest, "method": outcome.method})
        else:
            artifact.transition(ArtifactState.REJECTED)
            artifact.rejection_code = outcome.code
            artifact.rejection_message = outcome.message
            artifact.rejection_detail = outcome.detail
            artifact.last_error = None
            record_audit(session, actor=WORKER_ACTOR, action="artifact.rejected",
                         namespace=namespace, target=f"artifact:{artifact.id}",
                         detail={"code": outcome.code, "message": outcome.message})
        state = artifact.state
        session.commit()
        return state
