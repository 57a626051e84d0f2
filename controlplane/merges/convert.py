"""ORM -> response conversion for merged releases."""

from __future__ import annotations

from typing import cast

from controlplane.artifacts.schemas import Rejection
from controlplane.merges.schemas import MergeAdapterOut, MergeOut, MergeStateName, ReleaseDtype
from controlplane.models import Merge


def merge_out(m: Merge) -> MergeOut:
    rejection = None if m.rejection_code is None else Rejection(
        code=m.rejection_code, message=m.rejection_message or "",
        detail=m.rejection_detail or {})
    return MergeOut(
        id=m.id, namespace=m.namespace.name, name=m.name,
        state=cast(MergeStateName, m.state), base=m.base.h_base,
        adapters=[MergeAdapterOut(**a) for a in m.adapters],
        dtype=cast(ReleaseDtype, m.dtype), spec=m.spec, base_uri=m.base_uri,
        request_sha256=m.request_sha256, digest=m.digest,
        merged_base=None if m.merged_base is None else m.merged_base.h_base,
        manifest=m.manifest, storage_key=m.storage_key, files=m.files,
        size_bytes=m.size_bytes, metrics=m.metrics, rejection=rejection,
        merge_attempts=m.merge_attempts, last_error=m.last_error, created_at=m.created_at,
        merged_at=m.merged_at)
