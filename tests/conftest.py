"""Session-wide service fixtures shared by every test package.

Services are real: PostgreSQL and Redis are started by `scripts/services.sh`
(the README's test command); moto's S3 server is started here as a real HTTP
server subprocess on a free loopback port.

Under pytest-xdist (`-n N`, as scripts/test.sh runs the suite) each worker `gwK` gets its
own Postgres database (`<test database>_gwK`, created by scripts/services.sh for K < 4)
and its own Redis database (the test database's number minus K), so one worker's
TRUNCATEs and queues never meet another's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    import torch

DEFAULT_DATABASE_URL = (
    "postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane_test"
)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def xdist_worker() -> int | None:
    """This process's pytest-xdist worker number (`gw3` -> 3), or None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else None


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of the Postgres test database (this xdist worker's own)."""
    from sqlalchemy.engine import make_url

    url = make_url(os.environ.get("ADAPTERPLANE_TEST_DATABASE_URL", DEFAULT_DATABASE_URL))
    worker = xdist_worker()
    if worker is not None:
        url = url.set(database=f"{url.database}_gw{worker}")
    return url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """Redis URL of the test database (this xdist worker's own: one number lower per
    worker)."""
    url = os.environ.get("ADAPTERPLANE_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    worker = xdist_worker()
    if worker is None:
        return url
    root, _, db = url.rpartition("/")
    return f"{root}/{int(db or 0) - worker}"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server over real HTTP; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto S3 server did not start") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def private_schema(postgres_url: str, prefix: str) -> Iterator[str]:
    """A database URL confined to a fresh schema of the Postgres test database (its
    `search_path`), dropped on exit: a session-long server keeps its tables while other
    packages TRUNCATE theirs between tests."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from controlplane.db import make_engine

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = make_engine(postgres_url, pool_size=1)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(scope="session")
def schema_database(postgres_url: str) -> Callable[[str], AbstractContextManager[str]]:
    """`with schema_database("prefix") as url:` — see :func:`private_schema`."""
    return lambda prefix: private_schema(postgres_url, prefix)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M converted from the packaged GGUF, once per machine (prepare_smollm2 is
    cached by a marker; `ADAPTERPLANE_ASSET_CACHE` moves the cache)."""
    from dataplane.assets import prepare_smollm2

    cache = os.environ.get("ADAPTERPLANE_ASSET_CACHE")
    root = Path(cache) if cache else tmp_path_factory.getbasetemp().parent / "adapterplane-assets"
    return prepare_smollm2(root / "smollm2")


@pytest.fixture
def cuda_device() -> torch.device:
    """The CUDA device for `gpu`-marked tests (skipped without CUDA; torch imported here so
    the services' tests never load it)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda")
