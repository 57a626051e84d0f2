"""Collection bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.artifacts.schemas import Rejection

CollectionStateName = Literal["pending", "fitting", "fitted", "rejected"]


class CollectionCreate(BaseModel):
    """Fit shared bases over an ordered set of validated artifacts of one base."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    base: str = Field(description="H_base every source must be validated against.")
    sources: list[str | int] = Field(min_length=1, max_length=512,
                               description="Artifact refs (id or `sha256:<H_artifact>`), "
                                           "in member order.")
    method: Literal["jd-full", "jd-diag"] = "jd-full"
    rank: int = Field(ge=1, le=4096, description="Shared rank R of every basis.")
    clusters: int = Field(default=1, ge=1, le=512)
    iterations: int = Field(default=10, ge=1, le=1000,
                            description="Alternating sweeps per basis fit.")
    rounds: int = Field(default=10, ge=0, le=1000,
                        description="Cluster fit/assign rounds (clusters > 1).")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="k-means++ seeding.")
    max_relative_error: str = Field(
        default="1/10", max_length=40,
        description="Release threshold in [0, 1] on each member's relative Frobenius "
                    "reconstruction error, as an exact fraction ('1/20') or decimal ('0.05').")


class CollectionSource(BaseModel):
    artifact_id: int
    digest: str = Field(description="H_artifact of the member.")


class CollectionOut(BaseModel):
    id: int
    namespace: str
    name: str
    state: CollectionStateName
    base: str = Field(description="H_base.")
    sources: list[CollectionSource]
    spec: dict[str, Any]
    request_sha256: str = Field(description="Digest of (H_base, source digests, spec).")
    digest: str | None = Field(description="H_collection of the fitted bundle.")
    storage_key: str | None
    files: dict[str, Any] | None
    assignment: list[int] | None = Field(description="Cluster of each member, in order.")
    size_bytes: int | None
    metrics: dict[str, Any] | None = Field(
        description="Per-member relative errors, parameter ledger, rounds run.")
    rejection: Rejection | None
    fit_attempts: int
    last_error: str | None
    created_at: datetime
    fitted_at: datetime | None


class BundleFile(BaseModel):
    sha256: str
    size: int
    url: str = Field(description="file:// path (embedded store) or a presigned S3 GET.")


class BundleOut(BaseModel):
    """Where to read a fitted collection's bundle; check each file's SHA-256 after reading
    (`dataplane.collections.read_bundle` then re-derives every digest)."""

    digest: str = Field(description="H_collection.")
    files: dict[str, BundleFile]
    url_ttl_s: int
