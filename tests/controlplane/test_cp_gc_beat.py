"""Celery beat runs blob GC periodically on the embedded SQLite broker: a real
`adapterplane worker --beat` process (the launcher's own command) with
`ADAPTERPLANE_GC_INTERVAL_S=1` removes an aged orphan blob, keeps a fresh one and a
referenced one, and audits each pass as `worker:gc`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cp_helpers import wait_for
from retention_helpers import backdate, stored_keys
from sqlalchemy import select

from controlplane.db import make_engine, make_session_factory, session_scope
from controlplane.models import AuditEntry
from controlplane.storage.file_store import FileObjectStore


def test_beat_collects_garbage_on_the_sqlite_broker(pg_url: str, tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "objects")
    aged = store.put_blob(io.BytesIO(b"an orphan from a push that never committed"))
    fresh = store.put_blob(io.BytesIO(b"an orphan written a moment ago"))
    backdate(store, {aged.key})
    env = {
        **os.environ,
        "ADAPTERPLANE_ENVIRONMENT": "test",
        "ADAPTERPLANE_DATA_DIR": str(tmp_path / "var"),  # SQLite broker + beat schedule
        "ADAPTERPLANE_DATABASE_URL": pg_url,
        "ADAPTERPLANE_STORAGE_URL": store.url,
        "ADAPTERPLANE_GC_INTERVAL_S": "1",
        "ADAPTERPLANE_JOB_REAP_INTERVAL_S": "0",
    }
    for name in ("ADAPTERPLANE_CELERY_BROKER_URL", "ADAPTERPLANE_CELERY_RESULT_BACKEND"):
        env.pop(name, None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.launcher", "worker", "--beat", "--pool", "solo"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    engine = make_engine(pg_url, pool_size=1)
    try:
        wait_for(lambda: aged.key not in stored_keys(store) or proc.poll() is not None,
                 what="beat's GC pass", timeout=60, interval=0.2)
        assert proc.poll() is None, log.read_text()
        assert stored_keys(store) == {fresh.key}
        with session_scope(make_session_factory(engine)) as session:
            removed = [key for detail in session.scalars(select(AuditEntry.detail).where(
                AuditEntry.action == "gc.run", AuditEntry.actor == "worker:gc"))
                for key in detail["keys"]]
        assert removed == [aged.key]
        assert list((tmp_path / "var").glob("celerybeat-schedule*"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        engine.dispose()
    if proc.returncode not in (0, -15):
        pytest.fail(log.read_text())
