"""alias hot mark: prefetch the alias's current artifact on every compatible agent

Revision ID: 0500
Revises: 0400
Create Date: 2026-12-15
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0500'
down_revision: str | None = '0400'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN with a constant default: SQLite adds it without rebuilding the
    # table (aliases is referenced by catalog_generations), existing rows read false.
    with op.batch_alter_table('aliases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hot', sa.Boolean(), server_default=sa.false(),
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('aliases', schema=None) as batch_op:
        batch_op.drop_column('hot')
