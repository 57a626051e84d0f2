"""initial registry schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table('api_tokens',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('token_sha256', sa.String(length=64), nullable=False),
    sa.Column('grants', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('is_agent', sa.Boolean(), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_sha256', name=op.f('uq_api_tokens_token_sha256'))
    )
    op.create_table('audit_log',
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('namespace', sa.String(length=63), nullable=True),
    sa.Column('target', sa.String(length=300), nullable=False),
    sa.Column('detail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_log_namespace_id', ['namespace', 'id'], unique=False)

    op.create_table('base_models',
    sa.Column('h_base', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('architecture', sa.String(length=200), nullable=True),
    sa.Column('abi', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_base_models')),
    sa.UniqueConstraint('h_base', name=op.f('uq_base_models_h_base'))
    )
    op.create_table('namespaces',
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_namespaces')),
    sa.UniqueConstraint('name', name=op.f('uq_namespaces_name'))
    )
    op.create_table('aliases',
    sa.Column('namespace_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('base_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('current_generation', sa.Integer(), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['base_id'], ['base_models.id'], name=op.f('fk_aliases_base_id_base_models')),
    sa.ForeignKeyConstraint(['namespace_id'], ['namespaces.id'], name=op.f('fk_aliases_namespace_id_namespaces')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_aliases')),
    sa.UniqueConstraint('namespace_id', 'name', name=op.f('uq_aliases_namespace_id_name'))
    )
    op.create_table('artifacts',
    sa.Column('namespace_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('base_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('upload_sha256', sa.String(length=64), nullable=False),
    sa.Column('storage_key', sa.String(length=300), nullable=False),
    sa.Column('files', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('validation_attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('digest', sa.String(length=64), nullable=True),
    sa.Column('method', sa.String(length=32), nullable=True),
    sa.Column('modules', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('tensor_bytes', sa.BigInteger(), nullable=True),
    sa.Column('validated_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('rejection_code', sa.String(length=64), nullable=True),
    sa.Column('rejection_message', sa.Text(), nullable=True),
    sa.Column('rejection_detail', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['base_id'], ['base_models.id'], name=op.f('fk_artifacts_base_id_base_models')),
    sa.ForeignKeyConstraint(['namespace_id'], ['namespaces.id'], name=op.f('fk_artifacts_namespace_id_namespaces')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_artifacts')),
    sa.UniqueConstraint('namespace_id', 'base_id', 'upload_sha256', name=op.f('uq_artifacts_namespace_id_base_id_upload_sha256'))
    )
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.create_index('ix_artifacts_namespace_id_digest', ['namespace_id', 'digest'], unique=False)
        batch_op.create_index('ix_artifacts_namespace_id_id', ['namespace_id', 'id'], unique=False)

    op.create_table('catalog_generations',
    sa.Column('alias_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('artifact_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_sha256', sa.String(length=64), nullable=True),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['alias_id'], ['aliases.id'], name=op.f('fk_catalog_generations_alias_id_aliases')),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_catalog_generations_artifact_id_artifacts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_catalog_generations')),
    sa.UniqueConstraint('alias_id', 'generation', name=op.f('uq_catalog_generations_alias_id_generation')),
    sa.UniqueConstraint('alias_id', 'idempotency_key', name=op.f('uq_catalog_generations_alias_id_idempotency_key'))
    )



def downgrade() -> None:

    op.drop_table('catalog_generations')
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_index('ix_artifacts_namespace_id_id')
        batch_op.drop_index('ix_artifacts_namespace_id_digest')

    op.drop_table('artifacts')
    op.drop_table('aliases')
    op.drop_table('namespaces')
    op.drop_table('base_models')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_log_namespace_id')

    op.drop_table('audit_log')
    op.drop_table('api_tokens')

