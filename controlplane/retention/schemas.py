"""Bodies of `POST /v1/gc`."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class GcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(default=False, description="Report what would be removed; "
                                                     "remove nothing.")


class RemovedBlob(BaseModel):
    key: str
    size_bytes: int
    modified_at: datetime = Field(description="The blob's last write in the object store.")


class GcReport(BaseModel):
    dry_run: bool
    grace_s: int = Field(description="`ADAPTERPLANE_GC_GRACE_S` of this pass.")
    scanned: int = Field(description="Blobs listed under `blobs/sha256/`.")
    removed: list[RemovedBlob] = Field(description="Blobs removed (dry run: that would be).")
    removed_bytes: int
    kept_referenced: int = Field(description="Older than the grace but referenced by a row.")
    kept_recent: int = Field(description="Written within the grace period.")
    kept_leased: int = Field(description="Unreferenced, but a push or fit leased them within "
                                         "the grace period (it is about to reference them).")
    leases_purged: int = Field(description="Leases older than the grace removed (0 when dry).")
