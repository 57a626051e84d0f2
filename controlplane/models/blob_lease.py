"""Blob leases: the object-store keys a writer is about to reference.

A push (or a collection fit) writes `(key, leased_at)` for each blob *before* it checks
whether the blob is already stored, and commits its artifact row afterwards. Garbage
collection deletes a blob only while it holds this row's lock and finds the lease older
than the grace period (controlplane/retention/collector.py), so a writer that is
between "the blob is there" and "my row references it" is never robbed of its blob.
Rows are refreshed by every writer and purged by GC once older than the grace.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models.base import Base


class BlobLease(Base):
    __tablename__ = "blob_leases"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    leased_at: Mapped[datetime] = mapped_column(nullable=False)
