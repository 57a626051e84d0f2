"""Submit a merged release: resolve and freeze the ordered adapter list, insert one
`pending` row with its audit row, and send the merge job after commit.

The request digest covers (H_base, each adapter's H_artifact and exact weight in order,
dtype, normalised spec): submitting the same request again returns the existing row (and
re-sends its job if it never finished). Every adapter must be a validated, always-on
artifact of the named base in the same namespace; nothing is written when a check fails.
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
from controlplane.collections.service import parse_threshold
from controlplane.config import Settings
from controlplane.db import begin_write
from controlplane.errors import AloraUnsupported, BadRequest, BaseMismatch, InvalidState
from controlplane.merges.checkpoint_source import check_base_uri
from controlplane.merges.repository import MergeRepository
from controlplane.merges.schemas import MergeCreate
from controlplane.merges.thresholds import THRESHOLDS
from controlplane.models import ArtifactState, Merge, MergeState
from controlplane.namespaces.repository import NamespaceRepository
from controlplane.worker.jobs import JobQueue

MERGE_TASK = "adapterplane.merge_release"


def fraction_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def parse_weight(text: str) -> Fraction:
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError) as exc:
        raise BadRequest("an adapter weight must be a fraction or decimal > 0",
                         detail={"field": "weight", "value": text}) from exc
    if value <= 0:
        raise BadRequest("an adapter weight must be > 0", detail={"field": "weight",
                                                                  "value": text})
    return value


def _request_digest(h_base: str, adapters: list[dict[str, Any]], dtype: str,
                    spec: dict[str, Any]) -> str:
    document = json.dumps({"base": h_base, "dtype": dtype, "spec": spec,
                           "adapters": [[a["digest"], a["weight"]] for a in adapters]},
                          sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(document.encode()).hexdigest()


def _resolve_adapters(session: Session, namespace_id: int, base_id: int, body: MergeCreate
                      ) -> list[dict[str, Any]]:
    artifacts = ArtifactRepository(session)
    adapters: list[dict[str, Any]] = []
    for item in body.adapters:
        ref = str(item.artifact)
        artifact = artifacts.get_by_ref(namespace_id, ref, hold=True)
        if artifact.state != ArtifactState.VALIDATED.value:
            raise InvalidState(f"adapter {ref} is {artifact.state}, not validated",
                               detail={"adapter": ref, "state": artifact.state})
        if artifact.base_id != base_id:
            raise BaseMismatch(f"adapter {ref} was validated against another base",
                               detail={"adapter": ref, "base": artifact.base.h_base,
                                       "expected": body.base})
        if (artifact.validated_record or {}).get("alora_invocation_tokens") is not None:
            raise AloraUnsupported(f"adapter {ref} is an activated LoRA: a merged weight "
                                   "applies to every token", detail={"adapter": ref})
        adapters.append({"artifact_id": artifact.id, "digest": artifact.digest,
                         "weight": fraction_text(parse_weight(item.weight))})
    digests = [str(a["digest"]) for a in adapters]
    if len(set(digests)) != len(digests):
        raise BadRequest("a merge lists each adapter once",
                         detail={"duplicates": sorted({d for d in digests
                                                       if digests.count(d) > 1})})
    return adapters


def submit_merge(session: Session, jobs: JobQueue, settings: Settings, *, namespace: str,
                 body: MergeCreate, actor: str) -> tuple[Merge, bool]:
    """Return `(merge, created)`."""
    check_base_uri(body.base_uri, settings)
    threshold = (THRESHOLDS[body.dtype] if body.max_relative_error is None
                 else parse_threshold(body.max_relative_error))
    spec = {"max_relative_error": fraction_text(threshold)}
    begin_write(session)
    ns = NamespaceRepository(session).get_by_name(namespace)
    base = BaseModelRepository(session).get_by_h_base(body.base)
    adapters = _resolve_adapters(session, ns.id, base.id, body)
    request_sha256 = _request_digest(body.base, adapters, body.dtype, spec)
    repo = MergeRepository(session)
    existing = repo.by_request(ns.id, request_sha256)
    if existing is not None:
        if existing.state in (MergeState.PENDING.value, MergeState.MERGING.value):
            jobs.enqueue(session, MERGE_TASK, existing.id)
        session.commit()
        return existing, False
    merge = Merge(namespace_id=ns.id, base_id=base.id, name=body.name, adapters=adapters,
                  dtype=body.dtype, spec=spec, base_uri=body.base_uri,
                  request_sha256=request_sha256, created_by=actor,
                  state=MergeState.PENDING.value, merge_attempts=0)
    try:
        repo.add(merge)
        record_audit(session, actor=actor, action="merge.submit", namespace=namespace,
                     target=f"merge:{merge.id}",
                     detail={"name": body.name, "request_sha256": request_sha256,
                             "base": body.base, "adapters": len(adapters),
                             "dtype": body.dtype, **spec})
        jobs.enqueue(session, MERGE_TASK, merge.id)
        session.commit()
    except IntegrityError:  # the same request raced us and won
        session.rollback()
        winner = MergeRepository(session).by_request(ns.id, request_sha256)
        if winner is None:
            raise
        return winner, False
    return merge, True
