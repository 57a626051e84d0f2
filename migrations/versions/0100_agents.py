"""agents

Revision ID: 0100
Revises: 0002
Create Date: 2026-11-29
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0100'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'agents',
        sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('url', sa.String(length=500), nullable=False),
        sa.Column('h_base', sa.String(length=64), nullable=False),
        sa.Column('capabilities', JSON_DOC, nullable=False),
        sa.Column('worker_epoch', sa.Integer(), nullable=False),
        sa.Column('registered_at', sa.DateTime(timezone=True),
                  nullable=False),
        sa.Column('last_heartbeat_at', sa.DateTime(timezone=True),
                  nullable=True),
        sa.Column('slots', JSON_DOC, nullable=False),
        sa.Column('load_failures', JSON_DOC, nullable=False),
        sa.Column('catalog_version', sa.Integer(), nullable=False),
        sa.Column('registered_by', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True),
                  nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_agents')),
        sa.UniqueConstraint('name', name=op.f('uq_agents_name')),
    )
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_h_base'), ['h_base'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_h_base'))
    op.drop_table('agents')
