"""agents.release_id: the merged release an operator assigned an agent to serve

Revision ID: 0770
Revises: 0760
Create Date: 2026-12-03
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0770'
down_revision: str | None = '0760'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('agents') as batch:
        batch.add_column(sa.Column('release_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                                   nullable=True))
        batch.create_foreign_key('fk_agents_release_id_merges', 'merges', ['release_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('agents') as batch:
        batch.drop_constraint('fk_agents_release_id_merges', type_='foreignkey')
        batch.drop_column('release_id')
