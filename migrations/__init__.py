"""Alembic migrations for the control-plane database (Postgres and SQLite).

Run them with `controlplane.migrate.upgrade_to_head(url)` (the `adapterplane migrate`
command) or `alembic -c migrations/alembic.ini upgrade head`.
"""
