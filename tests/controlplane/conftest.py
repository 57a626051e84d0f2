"""Control-plane fixtures: migrated databases (Postgres and SQLite), real PEFT assets,
apps with tokens, and live HTTP servers.

Postgres is migrated once per session with Alembic; every test that uses it starts
from empty tables (TRUNCATE ... RESTART IDENTITY), because several tests drive it from
other connections (threads, a Celery worker process) where a rolled-back outer
transaction cannot isolate them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cp_helpers import MAX_RANK, Api, Assets, bootstrap_token, close_app, make_settings
from fastapi.testclient import TestClient
from psycopg.errors import DeadlockDetected
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from controlplane.app import create_app
from controlplane.db import make_engine
from controlplane.migrate import upgrade_to_head
from controlplane.models import Base


@pytest.fixture(scope="session")
def pg_migrated(postgres_url: str) -> str:
    upgrade_to_head(postgres_url)
    return postgres_url


def truncate_all(url: str, attempts: int = 5) -> None:
    """Empties every table. A live worker's reaper may be reading the same tables (it
    runs at worker start), and Postgres can pick the TRUNCATE as a deadlock victim; the
    victim's transaction is rolled back whole, so it is retried."""
    engine = make_engine(url, pool_size=1)
    names = ", ".join(t.name for t in Base.metadata.sorted_tables)
    try:
        for attempt in range(attempts):
            try:
                with engine.begin() as conn:
                    conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
                return
            except OperationalError as exc:
                if not isinstance(exc.orig, DeadlockDetected) or attempt == attempts - 1:
                    raise
                time.sleep(0.1 * (attempt + 1))
    finally:
        engine.dispose()


@pytest.fixture
def pg_url(pg_migrated: str) -> str:
    truncate_all(pg_migrated)
    return pg_migrated


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade_to_head(url)
    return url


@pytest.fixture(params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on Postgres and on the embedded SQLite default."""
    name = "pg_url" if request.param == "postgres" else "sqlite_url"
    return str(request.getfixturevalue(name))


# ---------------------------------------------------------------- real PEFT assets


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    """A tiny Llama base, a second base, and real PEFT adapters made with fixed seeds."""
    import shutil

    from dataplane.artifacts import read_base_abi
    from dataplane.assets import make_peft_adapter, make_tiny_llama

    root = tmp_path_factory.mktemp("cp-assets")
    base = make_tiny_llama(root / "base", seed=0)
    other = make_tiny_llama(root / "other-base", seed=1, intermediate_size=96)
    targets = ["q_proj", "v_proj"]
    a = make_peft_adapter(base, root / "a", seed=1, rank=4, alpha=8, target_modules=targets)
    b = make_peft_adapter(base, root / "b", seed=2, rank=8, alpha=16, target_modules=targets)
    big = make_peft_adapter(base, root / "big", seed=3, rank=MAX_RANK * 2, alpha=8,
                            target_modules=["q_proj"])
    oth = make_peft_adapter(other, root / "oth", seed=4, rank=4, alpha=8,
                            target_modules=["gate_proj"])
    with_bin = root / "with-bin"
    shutil.copytree(a, with_bin)
    (with_bin / "adapter_model.bin").write_bytes(b"not really a pickle")
    abi = read_base_abi(base).to_record()
    return Assets(base_dir=base, abi=json.loads(json.dumps(abi)), h_base=str(abi["h_base"]),
                  other_base_dir=other,
                  other_abi=json.loads(json.dumps(read_base_abi(other).to_record())),
                  adapter_a=a, adapter_b=b, adapter_big_rank=big, adapter_other_base=oth,
                  adapter_with_bin=with_bin)



# ---------------------------------------------------------------- apps


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = make_settings(database_url, tmp_path / "var")
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        yield Api(app=app, client=client, settings=settings, admin=admin)
    close_app(app)


