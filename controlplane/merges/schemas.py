"""Merged-release bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.artifacts.schemas import Rejection

MergeStateName = Literal["pending", "merging", "merged", "rejected"]
ReleaseDtype = Literal["bf16", "fp16", "fp32"]
EXACT_NUMBER = r"^[0-9]{1,18}(\.[0-9]{1,18})?(/[0-9]{1,18})?$"
"""A decimal or a fraction of bounded digits (no exponents: `Fraction("1e-99999999")`
would build a huge integer)."""


class MergeAdapterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    artifact: str | int = Field(description="Artifact id or `sha256:<H_artifact>`.")
    weight: str = Field(default="1", max_length=40, pattern=EXACT_NUMBER,
                        description="Multiplier of the adapter's delta, an exact fraction "
                                    "('1/2') or decimal ('0.5'), > 0.")


class MergeCreate(BaseModel):
    """Merge an ordered list of validated adapters of one base into a new base revision."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    base: str = Field(description="H_base every adapter must be validated against.")
    adapters: list[MergeAdapterIn] = Field(min_length=1, max_length=64,
                                           description="In merge order.")
    dtype: ReleaseDtype = Field(description="Dtype of the released weights (one rounding).")
    base_uri: str = Field(min_length=1, max_length=1000,
                          description="`s3://bucket/prefix` or `file:///dir` of the source "
                                      "base checkpoint; its ABI must re-derive `base`.")
    max_relative_error: str | None = Field(
        default=None, max_length=40, pattern=EXACT_NUMBER,
        description="Exactness-gate threshold in [0, 1] on the maximum relative logit error "
                    "(default per dtype: fp32 1/10000, fp16 1/100, bf16 1/20).")


class MergeAdapterOut(BaseModel):
    artifact_id: int
    digest: str = Field(description="H_artifact.")
    weight: str = Field(description="Exact fraction 'p/q'.")


class MergeOut(BaseModel):
    id: int
    namespace: str
    name: str
    state: MergeStateName
    base: str = Field(description="Source H_base.")
    adapters: list[MergeAdapterOut]
    dtype: ReleaseDtype
    spec: dict[str, Any]
    base_uri: str
    request_sha256: str = Field(description="Digest of (H_base, adapters and weights, dtype, "
                                            "spec).")
    digest: str | None = Field(description="H_merged of the release.")
    merged_base: str | None = Field(description="H_base of the released checkpoint.")
    manifest: dict[str, Any] | None
    storage_key: str | None
    files: dict[str, Any] | None
    size_bytes: int | None
    metrics: dict[str, Any] | None = Field(
        description="Exactness gate: per-probe and maximum relative logit error, threshold.")
    rejection: Rejection | None
    merge_attempts: int
    last_error: str | None
    created_at: datetime
    merged_at: datetime | None


class LineageOut(BaseModel):
    """The merged releases (visible to the caller) that produced base `h_base`."""

    h_base: str
    merges: list[MergeOut]

