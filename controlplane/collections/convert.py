"""ORM -> response conversion for collections."""

from __future__ import annotations

from typing import cast

from controlplane.artifacts.convert import rejection_of
from controlplane.collections.schemas import CollectionOut, CollectionSource, CollectionStateName
from controlplane.models import Collection


def collection_out(c: Collection) -> CollectionOut:
    return CollectionOut(
        id=c.id, namespace=c.namespace.name, name=c.name,
        state=cast(CollectionStateName, c.state), base=c.base.h_base,
        sources=[CollectionSource(**s) for s in c.sources], spec=c.spec,
        request_sha256=c.request_sha256, digest=c.digest, storage_key=c.storage_key,
        files=c.files, assignment=c.assignment, size_bytes=c.size_bytes, metrics=c.metrics,
        rejection=rejection_of(c), fit_attempts=c.fit_attempts, last_error=c.last_error,
        created_at=c.created_at, fitted_at=c.fitted_at)
