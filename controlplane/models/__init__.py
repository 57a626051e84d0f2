"""All ORM models (SQLAlchemy 2.0, typed). Import from here so metadata is complete."""

from __future__ import annotations

from controlplane.models.agent import Agent
from controlplane.models.api_token import ApiToken
from controlplane.models.artifact import (
    Artifact,
    ArtifactState,
    ArtifactStateError,
)
from controlplane.models.audit import AuditEntry
from controlplane.models.base import Base, utcnow
from controlplane.models.base_model import BaseModel
from controlplane.models.blob_lease import BlobLease
from controlplane.models.catalog import Alias, CatalogAction, CatalogGeneration
from controlplane.models.collection import Collection, CollectionState, CollectionStateError
from controlplane.models.collection_member import CollectionMember, CollectionMemberError
from controlplane.models.merge import Merge, MergeState, MergeStateError
from controlplane.models.namespace import Namespace

__all__ = [
    "Agent",
    "Alias",
    "ApiToken",
    "Artifact",
    "ArtifactState",
    "ArtifactStateError",
    "AuditEntry",
    "Base",
    "BaseModel",
    "BlobLease",
    "CatalogAction",
    "CatalogGeneration",
    "Collection",
    "CollectionMember",
    "CollectionMemberError",
    "CollectionState",
    "CollectionStateError",
    "Merge",
    "MergeState",
    "MergeStateError",
    "Namespace",
    "utcnow",
]
