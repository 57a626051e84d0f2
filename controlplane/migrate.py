"""Schema migrations through Alembic (the only way tables are created outside tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from controlplane.db import normalize_database_url


def alembic_config(database_url: str) -> Config:
    """An Alembic config that works from a source tree and from an installed package."""
    script_dir = Path(migrations.__file__).resolve().parent
    cfg = Config(str(script_dir / "alembic.ini"))
    cfg.set_main_option("script_location", str(script_dir))
    url = normalize_database_url(database_url).render_as_string(hide_password=False)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_to_head(database_url: str) -> None:
    """Bring the database at `database_url` to the newest schema (idempotent)."""
    command.upgrade(alembic_config(database_url), "head")


def current_revision(database_url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from controlplane.db import make_engine

    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
