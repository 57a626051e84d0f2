"""Artifact bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class ArtifactImport(BaseModel):
    """JSON push: import the adapter directory at `uri`."""

    base: str = Field(description="H_base of a registered base model.")
    uri: str = Field(description="`s3://bucket/prefix` or `file:///dir` holding "
                                 "adapter_config.json + adapter_model.safetensors.")


class Rejection(BaseModel):
    code: str = Field(description="Lowercase `dataplane.artifacts.RejectionCode`, or "
                                  "`checksum_mismatch` / `object_missing` for storage faults.")
    message: str
    detail: dict[str, Any]


class ArtifactOut(BaseModel):
    id: int
    namespace: str
    state: Literal["pending", "validating", "validated", "rejected"]
    digest: str | None = Field(description="H_artifact once validated.")
    base: str = Field(description="H_base.")
    method: str | None
    upload_sha256: str = Field(description="SHA-256 of the upload manifest (file digests).")
    storage_key: str
    size_bytes: int
    tensor_bytes: int | None
    files: dict[str, Any]
    modules: list[Any] | None
    validated_record: dict[str, Any] | None = Field(
        description="`ValidatedArtifact.to_record()` (digests re-derivable from it).")
    rejection: Rejection | None
    validation_attempts: int
    last_error: str | None = Field(description="Last transient failure while validating.")
    created_at: datetime
    validated_at: datetime | None


class ArtifactSummary(BaseModel):
    id: int
    digest: str | None
    base: str
    method: str | None
