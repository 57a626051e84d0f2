"""agents: drain flag, drained report, last reported load

Revision ID: 0700
Revises: 0600
Create Date: 2026-12-17
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0700'
down_revision: str | None = '0600'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_doc = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('load', json_doc, nullable=False, server_default='{}'))
        batch_op.add_column(sa.Column('drain', sa.Boolean(), nullable=False,
                                      server_default=sa.false()))
        batch_op.add_column(sa.Column('drained', sa.Boolean(), nullable=False,
                                      server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_column('drained')
        batch_op.drop_column('drain')
        batch_op.drop_column('load')
