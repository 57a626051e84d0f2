"""Submit a collection fit: resolve and freeze the ordered source set, insert one `pending`
row with its audit row, and send the fit job after commit.

The request digest covers (H_base, the members' H_artifact in order, the normalised spec):
submitting the same request again returns the existing row (and re-sends its job if it
never finished). Every source must be a validated artifact of the named base in the same
namespace; nothing is written when any check fails.
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.artifacts.repository import ArtifactRepository
from controlplane.audit.service import record_audit
from controlplane.bases.repository import BaseModelRepository
from controlplane.collections.repository import CollectionRepository
from controlplane.collections.schemas import CollectionCreate
from controlplane.db import begin_write
from controlplane.errors import AloraUnsupported, BadRequest, BaseMismatch, InvalidState
from controlplane.models import ArtifactState, Collection, CollectionState
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.worker.jobs import JobQueue

FIT_TASK = "adapterplane.fit_collection"


def parse_threshold(text: str) -> Fraction:
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError) as exc:
        raise BadRequest("max_relative_error must be a fraction or decimal in [0, 1]",
                         detail={"field": "max_relative_error", "value": text}) from exc
    if not 0 <= value <= 1:
        raise BadRequest("max_relative_error must be in [0, 1]",
                         detail={"field": "max_relative_error", "value": text})
    return value


def normalised_spec(body: CollectionCreate, members: int) -> dict[str, Any]:
    if body.clusters > members:
        raise BadRequest("clusters cannot exceed the number of sources",
                         detail={"clusters": body.clusters, "sources": members})
    threshold = parse_threshold(body.max_relative_error)
    return {"method": body.method, "rank": body.rank, "clusters": body.clusters,
            "iterations": body.iterations, "rounds": body.rounds, "seed": body.seed,
            "max_relative_error": f"{threshold.numerator}/{threshold.denominator}"}


def _request_digest(h_base: str, digests: list[str], spec: dict[str, Any]) -> str:
    document = json.dumps({"base": h_base, "sources": digests, "spec": spec},
                          sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(document.encode()).hexdigest()


def submit_collection(session: Session, jobs: JobQueue, *, namespace: str,
                      body: CollectionCreate, actor: str) -> tuple[Collection, bool]:
    """Return `(collection, created)`."""
    begin_write(session)
    ns = NamespaceRepository(session).get_by_name(namespace)
    base = BaseModelRepository(session).get_by_h_base(body.base)
    artifacts = ArtifactRepository(session)
    sources: list[dict[str, Any]] = []
    for ref in body.sources:
        artifact = artifacts.get_by_ref(ns.id, str(ref), hold=True)
        if artifact.state != ArtifactState.VALIDATED.value:
            raise InvalidState(f"source {ref} is {artifact.state}, not validated",
                               detail={"source": ref, "state": artifact.state})
        if artifact.base_id != base.id:
            raise BaseMismatch(f"source {ref} was validated against another base",
                               detail={"source": ref, "base": artifact.base.h_base,
                                       "expected": body.base})
        if (artifact.validated_record or {}).get("alora_invocation_tokens") is not None:
            raise AloraUnsupported(f"source {ref} is an activated LoRA: collection members "
                                   "are always on", detail={"source": ref})
        sources.append({"artifact_id": artifact.id, "digest": artifact.digest})
    digests = [str(s["digest"]) for s in sources]
    if len(set(digests)) != len(digests):
        raise BadRequest("a collection lists each adapter once",
                         detail={"duplicates": sorted({d for d in digests
                                                       if digests.count(d) > 1})})
    spec = normalised_spec(body, len(sources))
    request_sha256 = _request_digest(body.base, digests, spec)
    repo = CollectionRepository(session)
    existing = repo.by_request(ns.id, request_sha256)
    if existing is not None:
        if existing.state in (CollectionState.PENDING.value, CollectionState.FITTING.value):
            jobs.enqueue(session, FIT_TASK, existing.id)
        session.commit()
        return existing, False
    collection = Collection(
        namespace_id=ns.id, base_id=base.id, name=body.name, sources=sources, spec=spec,
        request_sha256=request_sha256, created_by=actor, state=CollectionState.PENDING.value,
        fit_attempts=0)
    try:
        repo.add(collection)
        record_audit(session, actor=actor, action="collection.submit", namespace=namespace,
                     target=f"collection:{collection.id}",
                     detail={"name": body.name, "request_sha256": request_sha256,
                             "sources": len(sources), **spec})
        jobs.enqueue(session, FIT_TASK, collection.id)
        session.commit()
    except IntegrityError:  # the same request raced us and won
        session.rollback()
        winner = CollectionRepository(session).by_request(ns.id, request_sha256)
        if winner is None:
            raise
        return winner, False
    return collection, True
