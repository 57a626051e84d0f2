"""blob leases: keys a push or fit is about to reference (garbage-collection fence)

Revision ID: 0720
Revises: 0700
Create Date: 2026-12-03
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0720'
down_revision: str | None = '0700'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('blob_leases',
    sa.Column('key', sa.String(length=300), nullable=False),
    sa.Column('leased_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_blob_leases'))
    )


def downgrade() -> None:
    op.drop_table('blob_leases')
