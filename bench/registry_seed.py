"""Bulk seeding of the registry benchmark's catalog (SQLAlchemy Core, one transaction).

Layout (deterministic names, so load generators need no list of aliases):
namespaces `bench-00 .. bench-NN`, each with `ARTIFACTS_PER_NAMESPACE` validated
artifacts and `aliases_per_namespace` aliases `alias-00000 ..`, every alias at
generation 1 (`publish`) of one of its namespace's artifacts. All rows share one base
model. Seeding is skipped when the layout is already present; `reset()` deletes every
`bench-*` namespace with its rows (generations, aliases, artifacts, audit).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select

from controlplane.models import (
    Alias,
    Artifact,
    AuditEntry,
    BaseModel,
    CatalogGeneration,
    Namespace,
    utcnow,
)

PREFIX = "bench-"
ARTIFACTS_PER_NAMESPACE = 4
CHUNK = 10_000
BASE_H = hashlib.sha256(b"adapterplane-bench-base").hexdigest()


def namespace_name(i: int) -> str:
    return f"{PREFIX}{i:03d}"


def alias_name(j: int) -> str:
    return f"alias-{j:05d}"


@dataclass(frozen=True)
class SeedLayout:
    namespaces: int
    aliases_per_namespace: int
    artifact_ids: dict[str, list[int]]
    """namespace name -> ids of its validated artifacts."""

    @property
    def aliases(self) -> int:
        return self.namespaces * self.aliases_per_namespace


def _sha(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def _artifact_ids(engine: Engine, namespaces: int) -> dict[str, list[int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(Namespace.name, Artifact.id)
            .join(Artifact, Artifact.namespace_id == Namespace.id)
            .where(Namespace.name.in_([namespace_name(i) for i in range(namespaces)]))
            .order_by(Artifact.id)
        ).all()
    out: dict[str, list[int]] = {}
    for name, artifact_id in rows:
        out.setdefault(name, []).append(int(artifact_id))
    return out


def existing_layout(engine: Engine, namespaces: int, per_namespace: int) -> SeedLayout | None:
    """The seeded layout if it is complete, else None."""
    with engine.connect() as conn:
        count = conn.execute(
            select(func.count())
            .select_from(Alias)
            .join(Namespace, Alias.namespace_id == Namespace.id)
            .where(Namespace.name.like(f"{PREFIX}%"))
        ).scalar_one()
    if count != namespaces * per_namespace:
        return None
    ids = _artifact_ids(engine, namespaces)
    if len(ids) != namespaces:
        return None
    return SeedLayout(namespaces, per_namespace, ids)


def reset(engine: Engine) -> None:
    """Delete every `bench-*` namespace and all rows hanging off it."""
    with engine.begin() as conn:
        ns_ids = select(Namespace.id).where(Namespace.name.like(f"{PREFIX}%"))
        alias_ids = select(Alias.id).where(Alias.namespace_id.in_(ns_ids))
        conn.execute(delete(CatalogGeneration).where(CatalogGeneration.alias_id.in_(alias_ids)))
        conn.execute(delete(Alias).where(Alias.namespace_id.in_(ns_ids)))
        conn.execute(delete(Artifact).where(Artifact.namespace_id.in_(ns_ids)))
        conn.execute(delete(AuditEntry).where(AuditEntry.namespace.like(f"{PREFIX}%")))
        conn.execute(delete(Namespace).where(Namespace.name.like(f"{PREFIX}%")))


def seed(engine: Engine, namespaces: int, per_namespace: int) -> SeedLayout:
    """Insert the layout in one transaction (Core executemany in chunks of CHUNK rows)."""
    now = utcnow()
    with engine.begin() as conn:
        base_id = conn.execute(select(BaseModel.id).where(BaseModel.h_base == BASE_H)).scalar()
        if base_id is None:
            base_id = conn.execute(
                insert(BaseModel)
                .values(
                    h_base=BASE_H,
                    name="bench-base",
                    architecture="LlamaForCausalLM",
                    abi={"bench": True},
                    created_at=now,
                )
                .returning(BaseModel.id)
            ).scalar_one()
        ns_rows = [{"name": namespace_name(i), "created_at": now} for i in range(namespaces)]
        conn.execute(insert(Namespace), ns_rows)
        ns_ids = dict(
            conn.execute(
                select(Namespace.name, Namespace.id).where(Namespace.name.like(f"{PREFIX}%"))
            ).all()
        )
        artifacts: list[dict[str, Any]] = []
        for name, ns_id in ns_ids.items():
            for k in range(ARTIFACTS_PER_NAMESPACE):
                upload = _sha("upload", name, k)
                artifacts.append(
                    {
                        "namespace_id": ns_id,
                        "base_id": base_id,
                        "upload_sha256": upload,
                        "storage_key": f"manifests/sha256/{upload}",
                        "files": {},
                        "size_bytes": 1024,
                        "created_by": "bench",
                        "state": "validated",
                        "validation_attempts": 1,
                        "digest": _sha("artifact", name, k),
                        "method": "lora",
                        "modules": [],
                        "tensor_bytes": 1024,
                        "validated_at": now,
                        "created_at": now,
                    }
                )
        conn.execute(insert(Artifact), artifacts)
        art_rows = conn.execute(
            select(Artifact.namespace_id, Artifact.id)
            .where(Artifact.namespace_id.in_(list(ns_ids.values())))
            .order_by(Artifact.id)
        ).all()
        by_ns: dict[int, list[int]] = {}
        for ns_id, art_id in art_rows:
            by_ns.setdefault(int(ns_id), []).append(int(art_id))
        alias_rows = [
            {
                "namespace_id": ns_id,
                "name": alias_name(j),
                "base_id": base_id,
                "current_generation": 1,
                "created_at": now,
            }
            for ns_id in ns_ids.values()
            for j in range(per_namespace)
        ]
        for start in range(0, len(alias_rows), CHUNK):
            conn.execute(insert(Alias), alias_rows[start : start + CHUNK])
        alias_ids = conn.execute(
            select(Alias.id, Alias.namespace_id).where(
                Alias.namespace_id.in_(list(ns_ids.values()))
            )
        ).all()
        gen_rows = [
            {
                "alias_id": alias_id,
                "generation": 1,
                "action": "publish",
                "artifact_id": by_ns[int(ns_id)][alias_id % ARTIFACTS_PER_NAMESPACE],
                "actor": "bench-seed",
                "reason": "seed",
                "created_at": now,
            }
            for alias_id, ns_id in alias_ids
        ]
        for start in range(0, len(gen_rows), CHUNK):
            conn.execute(insert(CatalogGeneration), gen_rows[start : start + CHUNK])
    return SeedLayout(namespaces, per_namespace, _artifact_ids(engine, namespaces))
