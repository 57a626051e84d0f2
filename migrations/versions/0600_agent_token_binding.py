"""agent name bound to the token that registered it

Revision ID: 0600
Revises: 0500
Create Date: 2026-12-16
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0600'
down_revision: str | None = '0500'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rows read NULL (unbound): the next token that registers the name binds it.
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
                                      nullable=True))
        batch_op.create_foreign_key('fk_agents_token_id_api_tokens', 'api_tokens',
                                    ['token_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_constraint('fk_agents_token_id_api_tokens', type_='foreignkey')
        batch_op.drop_column('token_id')
