"""artifacts, collections: index on state (job gauges, reaper)

Revision ID: 0750
Revises: 0740
Create Date: 2026-12-03
"""
from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = '0750'
down_revision: str | None = '0740'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_artifacts_state', 'artifacts', ['state'])
    op.create_index('ix_collections_state', 'collections', ['state'])


def downgrade() -> None:
    op.drop_index('ix_collections_state', table_name='collections')
    op.drop_index('ix_artifacts_state', table_name='artifacts')
