"""merged releases

Revision ID: 0740
Revises: 0720
Create Date: 2026-12-03
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0740'
down_revision: str | None = '0720'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('merges',
    sa.Column('namespace_id', BIG_ID, nullable=False),
    sa.Column('base_id', BIG_ID, nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('adapters', JSON_DOC, nullable=False),
    sa.Column('dtype', sa.String(length=8), nullable=False),
    sa.Column('spec', JSON_DOC, nullable=False),
    sa.Column('base_uri', sa.String(length=1000), nullable=False),
    sa.Column('request_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('merge_attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('digest', sa.String(length=64), nullable=True),
    sa.Column('manifest', JSON_DOC, nullable=True),
    sa.Column('storage_key', sa.String(length=300), nullable=True),
    sa.Column('files', JSON_DOC, nullable=True),
    sa.Column('size_bytes', sa.BigInteger(), nullable=True),
    sa.Column('metrics', JSON_DOC, nullable=True),
    sa.Column('merged_base_id', BIG_ID, nullable=True),
    sa.Column('merged_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('rejection_code', sa.String(length=64), nullable=True),
    sa.Column('rejection_message', sa.Text(), nullable=True),
    sa.Column('rejection_detail', JSON_DOC, nullable=True),
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['base_id'], ['base_models.id'], name=op.f('fk_merges_base_id_base_models')),
    sa.ForeignKeyConstraint(['merged_base_id'], ['base_models.id'], name=op.f('fk_merges_merged_base_id_base_models')),
    sa.ForeignKeyConstraint(['namespace_id'], ['namespaces.id'], name=op.f('fk_merges_namespace_id_namespaces')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_merges')),
    sa.UniqueConstraint('namespace_id', 'request_sha256', name=op.f('uq_merges_namespace_id_request_sha256'))
    )
    with op.batch_alter_table('merges', schema=None) as batch_op:
        batch_op.create_index('ix_merges_namespace_id_id', ['namespace_id', 'id'], unique=False)
        batch_op.create_index('ix_merges_merged_base_id', ['merged_base_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('merges', schema=None) as batch_op:
        batch_op.drop_index('ix_merges_merged_base_id')
        batch_op.drop_index('ix_merges_namespace_id_id')

    op.drop_table('merges')
