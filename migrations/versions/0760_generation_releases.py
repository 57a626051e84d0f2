"""catalog_generations.merge_id: a generation may serve a merged release

Revision ID: 0760
Revises: 0750
Create Date: 2026-12-03
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0760'
down_revision: str | None = '0750'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('catalog_generations') as batch:
        batch.add_column(sa.Column('merge_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                                   nullable=True))
        batch.create_foreign_key('fk_catalog_generations_merge_id_merges', 'merges',
                                 ['merge_id'], ['id'])
        batch.create_check_constraint('ck_catalog_generations_one_target',
                                      'artifact_id IS NULL OR merge_id IS NULL')
    op.create_index('ix_catalog_generations_merge_id', 'catalog_generations', ['merge_id'])


def downgrade() -> None:
    op.drop_index('ix_catalog_generations_merge_id', table_name='catalog_generations')
    with op.batch_alter_table('catalog_generations') as batch:
        batch.drop_constraint('ck_catalog_generations_one_target', type_='check')
        batch.drop_constraint('fk_catalog_generations_merge_id_merges', type_='foreignkey')
        batch.drop_column('merge_id')
