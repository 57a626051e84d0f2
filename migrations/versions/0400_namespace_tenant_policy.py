"""namespace tenant policy: scheduling weight, priority class, policy revision

Revision ID: 0400
Revises: 0300
Create Date: 2026-12-08
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0400'
down_revision: str | None = '0300'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Column-level CHECKs ride on ADD COLUMN, which SQLite supports without rebuilding
    # the table (namespaces is referenced by artifacts, aliases, collections, ...).
    with op.batch_alter_table('namespaces', schema=None) as batch_op:
        batch_op.add_column(sa.Column(
            'weight', sa.Float(),
            sa.CheckConstraint('weight > 0 AND weight <= 1000',
                               name=op.f('ck_namespaces_weight_range')),
            server_default='1.0', nullable=False))
        batch_op.add_column(sa.Column(
            'priority', sa.String(length=16),
            sa.CheckConstraint("priority IN ('high', 'normal', 'low')",
                               name=op.f('ck_namespaces_priority_class')),
            server_default='normal', nullable=False))
        batch_op.add_column(sa.Column('policy_revision', sa.Integer(), server_default='1',
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('namespaces', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_namespaces_priority_class'), type_='check')
        batch_op.drop_constraint(op.f('ck_namespaces_weight_range'), type_='check')
        batch_op.drop_column('policy_revision')
        batch_op.drop_column('priority')
        batch_op.drop_column('weight')
