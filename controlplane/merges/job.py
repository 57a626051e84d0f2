"""The body of the merge job: claim, fetch, merge, gate, store the release, finish.

Each step runs in its own short transaction, as in artifact validation and collection
fits:

1. claim: `pending|merging -> merging`, attempts += 1 (row-locked). A merge already
   `merged`/`rejected` is left as it is: running the job twice is a no-op.
2. fetch every adapter's files (digest-checked) and the source base checkpoint from
   `base_uri`. A transient storage error propagates for the Celery retry after
   `last_error` is recorded; a source that is missing or refused rejects the merge.
3. check the checkpoint's ABI re-derives the source H_base, re-validate every adapter
   against it (its bytes must re-derive its recorded H_artifact), merge
   (`compute.merge_checkpoint`), build the manifest and H_merged.
4. gate: the merged checkpoint against the base with its adapters applied live
   (`gate.exactness_gate`); above the threshold the release is refused (`merge_inexact`)
   and its metrics are kept on the row. Nothing is stored for a refused release.
5. store the checkpoint files and `merge.json` as content-addressed blobs, each leased
   against garbage collection until the row references it (`controlplane.retention`; the
   same release stored twice is one copy), then finish: `merging -> merged` with H_merged,
   manifest, files and the merged base (registered as a base on first release, with an
   audit row), or `-> rejected`, in one transaction. If another run finished first,
   nothing changes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.artifacts.peft import parse_base_record
from controlplane.audit.service import record_audit
from controlplane.bases.repository import BaseModelRepository
from controlplane.config import Settings
from controlplane.db import session_scope
from controlplane.merges.checkpoint_source import (
    TOKENIZER_FILES,
    CheckpointUnavailable,
    fetch_checkpoint,
)
from controlplane.models import Artifact, BaseModel, Merge, MergeState, utcnow
from controlplane.retention.leases import factory_lease
from controlplane.storage import BlobClaim, ObjectStore
from controlplane.storage.base import file_sha256
from controlplane.worker.job_rows import Refused, fetch_blobs, locked, record_error, record_refusal

WORKER_ACTOR = "worker:merge_release"
MANIFEST_FILE = "merge.json"
ANY_RANK = 1 << 20
"""Adapters are re-validated for their bytes, not for an agent's rank limit: a merged
release serves no factors."""


@dataclass(frozen=True)
class Released:
    digest: str
    manifest: dict[str, Any]
    files: dict[str, Any]
    storage_key: str
    metrics: dict[str, Any]
    abi: dict[str, Any]

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


@dataclass(frozen=True)
class Claim:
    state: str
    name: str
    dtype: str
    threshold: Fraction
    base_uri: str
    base_abi: dict[str, Any]
    adapters: list[tuple[str, Fraction, dict[str, Any] | None]]
    """(H_artifact, weight, files) per adapter, in merge order (files None: the artifact
    was deleted since submission)."""


def merge_release_now(merge_id: int, *, session_factory: sessionmaker[Session],
                      store: ObjectStore, settings: Settings) -> str | None:
    """Run one merge attempt; return the merge's state afterwards (None: no row)."""
    claim = _claim(session_factory, merge_id)
    if claim is None or claim.state != MergeState.MERGING.value:
        return None if claim is None else claim.state
    with tempfile.TemporaryDirectory(prefix=f"adapterplane-merge-{merge_id}-") as tmp:
        root = Path(tmp)
        outcome: Released | Refused
        try:
            outcome = (_fetch(session_factory, store, settings, merge_id, claim, root)
                       or _merge_and_store(claim, root, store, factory_lease(session_factory)))
        except Exception as exc:  # storage (retried), a bug or an environment fault
            _record_error(session_factory, merge_id, f"{type(exc).__name__}: {exc}")
            raise
    return _finish(session_factory, merge_id, outcome)


def _claim(factory: sessionmaker[Session], merge_id: int) -> Claim | None:
    with session_scope(factory) as session:
        merge = locked(session, Merge, merge_id)
        if merge is None:
            return None
        if merge.state in (MergeState.PENDING.value, MergeState.MERGING.value):
            merge.transition(MergeState.MERGING)
            merge.merge_attempts += 1
        ids = [int(a["artifact_id"]) for a in merge.adapters]
        rows = {a.id: a for a in session.scalars(
            select(Artifact).where(Artifact.id.in_(ids))).unique()}
        adapters = [(str(a["digest"]), Fraction(str(a["weight"])),
                     dict(rows[int(a["artifact_id"])].files)
                     if int(a["artifact_id"]) in rows else None) for a in merge.adapters]
        claim = Claim(merge.state, merge.name, merge.dtype,
                      Fraction(str(merge.spec["max_relative_error"])), merge.base_uri,
                      dict(merge.base.abi), adapters)
        session.commit()
        return claim


def _fetch(factory: sessionmaker[Session], store: ObjectStore, settings: Settings,
           merge_id: int, claim: Claim, root: Path) -> Refused | None:
    for index, (_digest, _weight, files) in enumerate(claim.adapters):
        if files is None:
            return Refused("source_missing", f"adapter {index} was deleted",
                           {"adapter": index})
        dest = root / f"adapter-{index}"
        dest.mkdir()
        fault = fetch_blobs(store, files, dest, where=f"adapter {index} ",
                            detail={"adapter": index},
                            on_error=lambda m: _record_error(factory, merge_id, m))
        if fault is not None:
            return Refused(fault.code, fault.message, fault.detail)
    try:
        fetch_checkpoint(claim.base_uri, settings, root / "base")
    except CheckpointUnavailable as exc:
        return Refused("base_source_unavailable", exc.message, _jsonable(exc.detail))
    return None


def _merge_and_store(claim: Claim, root: Path, store: ObjectStore,
                     lease: BlobClaim) -> Released | Refused:
    from controlplane.merges.compute import MergeInputError, load_merge_adapter, merge_checkpoint
    from controlplane.merges.gate import exactness_gate
    from controlplane.merges.manifest import build_manifest, h_merged
    from dataplane.artifacts import ArtifactRejected, BaseModelABI, read_base_abi

    base = BaseModelABI.from_record(claim.base_abi)  # a stored record that fails: a fault
    try:
        found = read_base_abi(root / "base")
    except ArtifactRejected as exc:
        return Refused("base_source_invalid", f"base checkpoint refused: {exc.message}",
                       {"rejection": exc.code.value})
    if found.h_base != base.h_base:
        return Refused("base_mismatch", "the checkpoint at base_uri is not the source base",
                       {"expected": base.h_base, "found": found.h_base})
    out = root / "release"
    try:
        adapters = [load_merge_adapter(root / f"adapter-{i}", base, weight,
                                       expected_h_artifact=digest, max_rank=ANY_RANK)
                    for i, (digest, weight, _files) in enumerate(claim.adapters)]
        merged = merge_checkpoint(root / "base", base, adapters, claim.dtype, out)
    except MergeInputError as exc:
        return Refused(exc.code, exc.message, _jsonable(exc.detail))
    released = read_base_abi(out)
    tokenizer = {}
    for name in TOKENIZER_FILES:
        if (root / "base" / name).is_file():
            shutil.copyfile(root / "base" / name, out / name)
            tokenizer[name] = file_sha256(out / name)
    manifest = build_manifest(base, [(d, w) for d, w, _ in claim.adapters],
                              released.dtype, merged.modules, merged.tensors,
                              released.config_sha256, tokenizer)
    digest = h_merged(manifest)
    gate = exactness_gate(root / "base", out, adapters, base.vocab_size, claim.threshold)
    metrics = gate.metrics()
    if not gate.passed:
        return Refused("merge_inexact", f"merged logits differ from the live adapters by "
                       f"{gate.max_relative_error:.3g} (relative), above "
                       f"{metrics['threshold']}", {"h_merged": digest}, metrics)
    (out / MANIFEST_FILE).write_text(json.dumps({"h_merged": digest, "manifest": manifest},
                                                indent=1, sort_keys=True))
    files: dict[str, Any] = {}
    for path in sorted(out.iterdir()):
        with path.open("rb") as handle:
            ref = store.put_blob(handle, claim=lease)
        files[path.name] = {"sha256": ref.sha256, "size": ref.size, "key": ref.key}
    return Released(digest, dict(manifest), files, files[MANIFEST_FILE]["key"], metrics,
                    dict(released.to_record()))


def _jsonable(detail: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(detail, default=str))


def _record_error(factory: sessionmaker[Session], merge_id: int, message: str) -> None:
    record_error(factory, Merge, merge_id, MergeState.MERGING.value, message)


def _merged_base(session: Session, merge: Merge, abi: dict[str, Any]) -> BaseModel:
    """The released checkpoint as a base row: registered on its first release, reused by
    any release with the same H_base."""
    parsed = parse_base_record(abi)
    repo = BaseModelRepository(session)
    existing = repo.by_h_base(parsed.h_base)
    if existing is not None:
        return existing
    base = BaseModel(h_base=parsed.h_base, name=f"{merge.namespace.name}/{merge.name}",
                     architecture=parsed.architecture, abi=parsed.record)
    try:
        with session.begin_nested():  # another release of the same weights may win
            repo.add(base)
    except IntegrityError:
        return repo.get_by_h_base(parsed.h_base)
    record_audit(session, actor=WORKER_ACTOR, action="base.register",
                 target=f"base:{base.h_base}",
                 detail={"name": base.name, "merge": merge.id, "source": merge.base.h_base})
    return base


def _finish(factory: sessionmaker[Session], merge_id: int,
            outcome: Released | Refused) -> str | None:
    with session_scope(factory) as session:
        merge = locked(session, Merge, merge_id)
        if merge is None:
            return None
        if merge.state != MergeState.MERGING.value:
            return merge.state  # another run finished first
        namespace = merge.namespace.name
        target = f"merge:{merge.id}"
        if isinstance(outcome, Released):
            merged_base = _merged_base(session, merge, outcome.abi)
            merge.transition(MergeState.MERGED)
            merge.digest = outcome.digest
            merge.manifest = outcome.manifest
            merge.files = outcome.files
            merge.storage_key = outcome.storage_key
            merge.size_bytes = outcome.size_bytes
            merge.metrics = outcome.metrics
            merge.merged_base_id = merged_base.id
            merge.merged_at = utcnow()
            record_audit(session, actor=WORKER_ACTOR, action="merge.released",
                         namespace=namespace, target=target,
                         detail={"h_merged": outcome.digest, "merged_base": merged_base.h_base,
                                 "max_relative_error": outcome.metrics["max_relative_error"]})
        else:
            record_refusal(session, merge, outcome, MergeState.REJECTED, actor=WORKER_ACTOR,
                           action="merge.rejected", namespace=namespace, target=target)
        merge.last_error = None
        state = merge.state
        session.commit()
        return state
