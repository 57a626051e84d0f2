"""collection members

Revision ID: 0300
Revises: 0200
Create Date: 2026-12-01
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0300'
down_revision: str | None = '0200'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('collection_members',
    sa.Column('collection_id', BIG_ID, nullable=False),
    sa.Column('member_index', sa.Integer(), nullable=False),
    sa.Column('artifact_id', BIG_ID, nullable=False),
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_collection_members_artifact_id_artifacts')),
    sa.ForeignKeyConstraint(['collection_id'], ['collections.id'], name=op.f('fk_collection_members_collection_id_collections')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_collection_members')),
    sa.UniqueConstraint('collection_id', 'member_index', name=op.f('uq_collection_members_collection_id_member_index'))
    )
    with op.batch_alter_table('collection_members', schema=None) as batch_op:
        batch_op.create_index('ix_collection_members_artifact_id', ['artifact_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('collection_members', schema=None) as batch_op:
        batch_op.drop_index('ix_collection_members_artifact_id')
    op.drop_table('collection_members')
