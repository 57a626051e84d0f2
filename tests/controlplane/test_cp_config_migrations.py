"""Settings derive every default from data_dir and refuse default secrets in production;
Alembic migrations produce exactly the ORM schema on Postgres and SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from pydantic import SecretStr
from sqlalchemy import inspect

from controlplane.config import InsecureSettings, Settings
from controlplane.db import make_engine
from controlplane.migrate import alembic_config, current_revision, upgrade_to_head
from controlplane.models import Base


def test_defaults_derive_from_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTERPLANE_DATA_DIR", str(tmp_path))
    s = Settings()
    assert s.database_url == f"sqlite:///{tmp_path / 'adapterplane.db'}"
    assert s.storage_url == f"file://{(tmp_path / 'objects').resolve()}"
    assert s.celery_broker_url == f"sqla+sqlite:///{tmp_path / 'celery-broker.db'}"
    assert s.celery_result_backend == f"db+sqlite:///{tmp_path / 'celery-results.db'}"
    assert s.allow_file_uri_import is False and s.file_import_roots == []


def test_s3_bucket_shorthand_and_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTERPLANE_S3_BUCKET", "models")
    monkeypatch.setenv("ADAPTERPLANE_MAX_RANK", "64")
    s = Settings()
    assert (s.storage_url, s.max_rank) == ("s3://models", 64)


@pytest.mark.parametrize(("field", "value"), [
    ("database_url", "postgresql://adapterplane:adapterplane@db/adapterplane"),
    ("s3_secret_access_key", "minioadmin"),
])
def test_production_refuses_default_secrets(field: str, value: str) -> None:
    with pytest.raises(InsecureSettings):
        Settings.model_validate({"environment": "production", field: value})


def test_production_accepts_real_secrets_and_disables_file_imports() -> None:
    s = Settings(environment="production",
                 database_url="postgresql://ap:s3cr3t-9f2k@db/adapterplane",
                 s3_secret_access_key=SecretStr("x" * 40))
    assert s.allow_file_uri_import is False


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrations_match_models(backend: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue("pg_migrated" if backend == "postgres" else "sqlite_url"))
    upgrade_to_head(url)  # idempotent at head
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None and current_revision(url) == head
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert diff == []
    assert set(Base.metadata.tables) <= tables
