"""The body of the fit job: claim, fetch every member, fit, store the bundle, finish.

Each step runs in its own short transaction, as in artifact validation:

1. claim: `pending|fitting -> fitting`, attempts += 1 (row-locked). A collection already
   `fitted`/`rejected` is left as it is: running the job twice is a no-op.
2. fetch each member's files (digest-checked) into its own temp dir. A transient storage
   error propagates for the Celery retry after `last_error` is recorded.
3. fit with `dataplane.collections.compress_collection` (validates every member against
   the base again, checks each member's bytes re-derive its recorded H_artifact).
4. store the bundle files as content-addressed blobs plus a manifest blob, each leased
   first so blob GC leaves it alone until step 5 references it (controlplane/retention).
5. finish: `fitting -> fitted` (H_collection, files, assignment, metrics written once) or
   `-> rejected` (code, message, detail; a release refusal keeps its metrics), with an
   audit row, in one transaction. If another run finished first, nothing changes.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.audit.service import record_audit
from controlplane.db import session_scope
from controlplane.models import Artifact, Collection, CollectionState, utcnow
from controlplane.retention.leases import factory_lease
from controlplane.storage import BlobClaim, ObjectStore
from controlplane.worker.job_rows import Refused, fetch_blobs, locked, record_error, record_refusal

WORKER_ACTOR = "worker:fit_collection"
BUNDLE_MANIFEST_FORMAT = "adapterplane.collection-dir/v1"


@dataclass(frozen=True)
class Fitted:
    digest: str
    files: dict[str, Any]
    storage_key: str
    assignment: list[int]
    metrics: dict[str, Any]

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


@dataclass(frozen=True)
class Claim:
    state: str
    spec: dict[str, Any]
    base_abi: dict[str, Any]
    members: list[tuple[str, dict[str, Any]]]
    """(H_artifact, files) per member, in order."""


def fit_collection_now(collection_id: int, *, session_factory: sessionmaker[Session],
                       store: ObjectStore) -> str | None:
    """Run one fit attempt; return the collection's state afterwards (None: no row)."""
    claim = _claim(session_factory, collection_id)
    if claim is None or claim.state != CollectionState.FITTING.value:
        return None if claim is None else claim.state
    with tempfile.TemporaryDirectory(prefix=f"adapterplane-fit-{collection_id}-") as tmp:
        root = Path(tmp)
        refused = _fetch(session_factory, store, collection_id, claim, root)
        outcome: Fitted | Refused
        if refused is not None:
            outcome = refused
        else:
            try:
                outcome = _fit_and_store(claim, root, store, factory_lease(session_factory))
            except Exception as exc:  # storage (retried), a bug or an environment fault
                _record_error(session_factory, collection_id, f"{type(exc).__name__}: {exc}")
                raise
    return _finish(session_factory, collection_id, outcome)


def _locked(session: Session, collection_id: int) -> Collection | None:
    return locked(session, Collection, collection_id)


def _claim(factory: sessionmaker[Session], collection_id: int) -> Claim | None:
    with session_scope(factory) as session:
        collection = _locked(session, collection_id)
        if collection is None:
            return None
        if collection.state in (CollectionState.PENDING.value, CollectionState.FITTING.value):
            collection.transition(CollectionState.FITTING)
            collection.fit_attempts += 1
        ids = [int(s["artifact_id"]) for s in collection.sources]
        rows = {a.id: a for a in session.scalars(
            select(Artifact).where(Artifact.id.in_(ids))).unique()}
        members = [(str(rows[i].digest), dict(rows[i].files)) for i in ids]
        claim = Claim(collection.state, dict(collection.spec), dict(collection.base.abi),
                      members)
        session.commit()
        return claim


def _fetch(factory: sessionmaker[Session], store: ObjectStore, collection_id: int,
           claim: Claim, root: Path) -> Refused | None:
    for index, (_digest, files) in enumerate(claim.members):
        dest = root / f"member-{index}"
        dest.mkdir()
        fault = fetch_blobs(store, files, dest, where=f"member {index} ",
                            detail={"member": index},
                            on_error=lambda m: _record_error(factory, collection_id, m))
        if fault is not None:
            return Refused(fault.code, fault.message, fault.detail)
    return None


def _fit_and_store(claim: Claim, root: Path, store: ObjectStore,
                   lease: BlobClaim) -> Fitted | Refused:
    from fractions import Fraction

    from dataplane.artifacts import BaseModelABI
    from dataplane.collections import CollectionError, ReleaseRefused, write_bundle
    from dataplane.collections.compress import CompressionSpec, compress_collection
    from dataplane.core import EngineError

    spec = claim.spec
    # outside the try: a stored base record that no longer parses is a fault (recorded,
    # retried), not a refusal of this collection's sources
    base = BaseModelABI.from_record(claim.base_abi)
    try:
        bundle = compress_collection(
            [root / f"member-{i}" for i in range(len(claim.members))], base,
            sources_h_artifact=[digest for digest, _ in claim.members],
            spec=CompressionSpec(
                method=spec["method"], rank=spec["rank"], clusters=spec["clusters"],
                iterations=spec["iterations"], rounds=spec["rounds"], seed=spec["seed"],
                max_relative_error=Fraction(spec["max_relative_error"])))
    except ReleaseRefused as exc:
        metrics = dict(exc.detail.get("metrics") or {})
        return Refused("release_refused", exc.message,
                       {"worst_member": exc.detail.get("worst")}, metrics)
    except CollectionError as exc:
        return Refused("collection_invalid", exc.message, _jsonable(exc.detail))
    except EngineError as exc:  # a member refused by the engine's loader
        return Refused("source_invalid", exc.message, _jsonable(exc.detail))
    out = root / "bundle"
    write_bundle(bundle, out)
    files: dict[str, Any] = {}
    for path in sorted(out.iterdir()):
        with path.open("rb") as handle:
            ref = store.put_blob(handle, claim=lease)
        files[path.name] = {"sha256": ref.sha256, "size": ref.size, "key": ref.key}
    manifest = json.dumps({"format": BUNDLE_MANIFEST_FORMAT, "h_collection": bundle.h_collection,
                           "files": {n: {"sha256": f["sha256"], "size": f["size"]}
                                     for n, f in files.items()}},
                          sort_keys=True, separators=(",", ":")).encode()
    manifest_ref = store.put_blob_bytes(manifest, claim=lease)
    return Fitted(bundle.h_collection, files, manifest_ref.key, bundle.assignment,
                  dict(bundle.metrics))


def _jsonable(detail: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(detail, default=str))


def _record_error(factory: sessionmaker[Session], collection_id: int, message: str) -> None:
    record_error(factory, Collection, collection_id, CollectionState.FITTING.value, message)


def _finish(factory: sessionmaker[Session], collection_id: int,
            outcome: Fitted | Refused) -> str | None:
    with session_scope(factory) as session:
        collection = _locked(session, collection_id)
        if collection is None:
            return None
        if collection.state != CollectionState.FITTING.value:
            return collection.state  # another run finished first
        namespace = collection.namespace.name
        target = f"collection:{collection.id}"
        if isinstance(outcome, Fitted):
            collection.transition(CollectionState.FITTED)
            collection.digest = outcome.digest
            collection.files = outcome.files
            collection.storage_key = outcome.storage_key
            collection.assignment = outcome.assignment
            collection.size_bytes = outcome.size_bytes
            collection.metrics = outcome.metrics
            collection.fitted_at = utcnow()
            record_audit(session, actor=WORKER_ACTOR, action="collection.fitted",
                         namespace=namespace, target=target,
                         detail={"digest": outcome.digest,
                                 "max_relative_error": outcome.metrics["max_relative_error"]})
        else:
            record_refusal(session, collection, outcome, CollectionState.REJECTED,
                           actor=WORKER_ACTOR, action="collection.rejected",
                           namespace=namespace, target=target)
        collection.last_error = None
        state = collection.state
        session.commit()
        return state
