"""ORM -> response conversion for artifacts (shared by artifacts and catalog)."""

from __future__ import annotations

from typing import Literal, cast

from controlplane.artifacts.schemas import ArtifactOut, ArtifactSummary, Rejection
from controlplane.models import Artifact, Collection

StateName = Literal["pending", "validating", "validated", "rejected"]


def rejection_of(row: Artifact | Collection) -> Rejection | None:
    """The typed rejection a row carries (code, message, detail), or None."""
    if row.rejection_code is None:
        return None
    return Rejection(code=row.rejection_code, message=row.rejection_message or "",
                     detail=row.rejection_detail or {})


def artifact_out(a: Artifact) -> ArtifactOut:
    rejection = rejection_of(a)
    return ArtifactOut(
        id=a.id, namespace=a.namespace.name, state=cast(StateName, a.state), digest=a.digest,
        base=a.base.h_base, method=a.method, upload_sha256=a.upload_sha256,
        storage_key=a.storage_key, size_bytes=a.size_bytes, tensor_bytes=a.tensor_bytes,
        files=a.files, modules=a.modules, validated_record=a.validated_record,
        rejection=rejection,
        validation_attempts=a.validation_attempts, last_error=a.last_error,
        created_at=a.created_at,
        validated_at=a.validated_at)


def artifact_summary(a: Artifact) -> ArtifactSummary:
    return ArtifactSummary(id=a.id, digest=a.digest, base=a.base.h_base, method=a.method)
